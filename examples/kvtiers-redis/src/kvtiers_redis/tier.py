"""`RedisTier` (`{"type": "redis", ...}`): KV-cache blocks as values in a Redis
server - persistent (as the server is), verified, bounded by `capacity_bytes`,
with an optional expiry (`ttl_s`) that Redis enforces itself.

Threads and what they may do:

- the scheduler thread calls `lookup`, `submit_*`, `touch`, `get_finished_jobs`,
  `stats`: dictionary work on a `BoundedIndex` (key -> expiry), a hand-off to the
  loop, never I/O;
- the event loop of the core's `AsyncJobEngine` (one thread) runs every request
  through redis-py's asyncio client: `concurrency` at once, loads ahead of stores
  (`transfers.Transfers`), the deletes of evicted values, start-up;
- copier threads move block bytes between values and pool slots.

Start-up rebuilds the index from a SCAN of the namespace's names (`scan.py`: headers
only) in the recency order the last close wrote. A server that does not answer at
start-up is not an error - the tier starts empty, its jobs fail as misses, and it
scans again every `RETRY_S` until the server answers - but one that refuses the
credentials is (`ConfigError`). One engine per prefix and model: the tier is not
`shared` (two engines on one prefix would each evict by their own index).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import redis.asyncio as aioredis
from kvtiers.errors import ConfigError, ConfigProblem, UnknownNameError
from kvtiers.sdk import (
    BATCH_BYTES,
    AsyncJobEngine,
    BadBlock,
    BlockKey,
    BoundedIndex,
    ErrorCounts,
    IndexedTier,
    LookupResult,
    Progress,
    StatsRecorder,
    TierContext,
    TierInventory,
    TierStats,
    VerifyReport,
    type_name,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, ResponseError

from kvtiers_redis import ops
from kvtiers_redis.names import Names
from kvtiers_redis.scan import order, read_recency, scan
from kvtiers_redis.settings import settings_from
from kvtiers_redis.transfers import EXPECTED, Transfers, wall_ms

__all__ = ["RedisTier"]

STARTUP_TIMEOUT_S = 300.0
RETRY_S = 2.0  # a server away at start-up is asked again this often
#: lookup answers HIT only while a block has this long to live (or a quarter of
#: ttl_s, if less): a load submitted now must still find it
HIT_MARGIN_S = 0.5


class RedisTier(IndexedTier[int]):
    """See the module doc; config: `kvtiers_redis.schema.SCHEMA`. `IndexedTier`
    does the scheduler side's hand-offs (`submit_*`, `touch`, `get_finished_jobs`,
    `drain`)."""

    engine: AsyncJobEngine
    persistent = True
    verifies = True

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        settings = settings_from(config)
        super().__init__(ctx, config)
        self.settings = settings
        self.name = ctx.name or "redis"
        self.names = Names(settings.prefix, ctx.namespace.fingerprint)
        try:
            policy = ctx.make_policy(settings.eviction_policy,
                                     max(1, settings.capacity_bytes // ctx.block_bytes))
        except UnknownNameError as exc:
            raise ConfigError(ConfigProblem("$.eviction_policy", f"redis tier: {exc}")) from None
        self.index: BoundedIndex[int] = BoundedIndex(  # key -> expiry, wall ms (0: none)
            policy, settings.capacity_bytes, on_removed=ctx.events.removed)
        self._margin_ms = int(min(HIT_MARGIN_S, settings.ttl_s / 4) * 1000)
        self._stats = StatsRecorder(settings.capacity_bytes)
        self._errors = ErrorCounts(
            ctx.logger, f"kvtiers-redis {self.name} ({settings.address})", scrub=settings.scrub,
            kind=type_name, describe=lambda exc: f"{type(exc).__name__}: {exc}")
        self._tasks: set[asyncio.Task[None]] = set()
        self._retry: asyncio.Task[None] | None = None  # the start-up scan, asked again
        self._closed = False
        #: damaged values (bad header, key or length) the start-up scans deleted
        self.deleted_at_start = 0
        self._io = Transfers(ctx, settings, self.index, self.names, self._stats, self._errors,
                             self._spawn)
        loads = settings.concurrency // 2
        self.engine = AsyncJobEngine(
            ctx, load=self._io.load, store=self._io.store, load_concurrency=loads,
            store_concurrency=settings.concurrency - loads, stats=self._stats,
            batch_bytes=BATCH_BYTES, on_close=self._on_close, name=f"kvtiers-{self.name}",
            on_crash=lambda exc: self._errors.record("task", exc))
        try:
            self.engine.run(self._start(), timeout=STARTUP_TIMEOUT_S)
        except BaseException:
            self.engine.close(timeout=1.0)
            raise

    def __repr__(self) -> str:
        s = self.settings
        return f"RedisTier({s.address}, prefix={s.prefix!r}, capacity_bytes={s.capacity_bytes})"

    # -- start-up (on the loop) ------------------------------------------------------

    async def _start(self) -> None:
        s = self.settings
        client = aioredis.Redis.from_url(
            s.url, socket_timeout=s.timeout_s, socket_connect_timeout=s.timeout_s,
            # One retry, at once: a pooled connection that the server closed (it
            # restarted) is replaced; a server that is gone fails fast.
            retry=Retry(NoBackoff(), 1), health_check_interval=0, **s.client_options())
        self._io.attach(client)
        try:
            await self._adopt()
        except (AuthenticationError, ResponseError) as exc:
            await client.aclose()
            auth = isinstance(exc, AuthenticationError) or _is_auth(exc)
            raise ConfigError(ConfigProblem(
                "$.password" if auth else "$.url",
                f"redis tier: the server at {s.address} refused "
                f"{'the credentials' if auth else 'the tier'} "
                f"({type(exc).__name__}: {s.scrub(str(exc))})")) from None
        except EXPECTED as exc:  # an absent server costs misses, not a crash
            self._errors.record("start", exc)
            self.ctx.logger.warning(
                "kvtiers-redis %s: %s does not answer; starting empty, asking again every "
                "%.0f s", self.name, s.address, RETRY_S)
            self._retry = asyncio.get_running_loop().create_task(self._adopt_later())

    async def _adopt(self) -> None:
        """Read what the namespace holds into the index; delete what is damaged or
        no longer fits."""
        s, io = self.settings, self._io
        started = time.perf_counter()
        found = await scan(io.client, self.names, self.ctx.block_bytes, s.timeout_s, wall_ms())
        recency = await read_recency(io.client, self.names, s.timeout_s)
        doomed: list[bytes] = []
        for key, expires in order(found.blocks, recency):
            # (a later scan: stored meanwhile, or being taken back)
            if key not in self.index and key not in io.retractions:
                doomed += [k for k, _ in self.index.add(key, expires, self.ctx.block_bytes)]
        await io.client.set(self.names.namespace, json.dumps(ops.describe(self.ctx)))
        self.ctx.logger.info(
            "kvtiers-redis %s: %s holds %d blocks (%d bytes) under %s, scanned in %.2f s; "
            "%d damaged values deleted, %d over capacity, %d values of other formats left "
            "alone", self.name, s.address, len(self.index), self.index.committed_bytes,
            self.names.blocks.decode(), time.perf_counter() - started, len(found.broken),
            len(doomed), found.other)
        self.deleted_at_start += len(found.broken)
        if doomed:
            self._stats.evicted(len(doomed))
        if found.broken or doomed:
            self._spawn(io.unlink(found.broken + [self.names.block(k) for k in doomed]))

    async def _adopt_later(self) -> None:
        while True:
            await asyncio.sleep(RETRY_S)
            try:
                await self._adopt()
                return
            except (*EXPECTED, ResponseError) as exc:  # the next round tries again
                self._errors.record("start", exc)

    # -- scheduler side: memory only ---------------------------------------------------

    def lookup(self, key: BlockKey) -> LookupResult:
        expires = None if self._closed else self.index.get(key)
        hit = expires is not None and (not expires or expires > wall_ms() + self._margin_ms)
        if expires is not None and not hit:
            self.index.remove(key, expires)  # expired (Redis deletes the value itself)
        self._stats.lookup(hit)
        return LookupResult.HIT if hit else LookupResult.MISS

    def stats(self) -> TierStats:
        snap = self._stats.snapshot(usage_bytes=self.index.committed_bytes)
        snap.errors.update({f"redis.{k}": v for k, v in self._errors.snapshot().items()})
        return snap

    def close(self) -> None:
        """Write the recency order down (a hint for the next start-up), then stop."""
        if self._closed:
            return
        self._closed = True
        try:
            self.engine.run(asyncio.wait_for(self._io.client.set(
                self.names.recency, json.dumps(self.index.export())), self.settings.timeout_s))
        except Exception as exc:  # noqa: BLE001 - recency is advisory
            self._errors.record("recency", exc)
        self.engine.close(timeout=self.settings.timeout_s)

    # -- tools (`kvtiers inspect` / `verify`): any thread but the scheduler's ------------

    @property
    def location(self) -> str:
        """Where this namespace lives, without credentials: address and key prefix."""
        return f"{self.settings.address} {self.names.base.decode().rstrip(':')}"

    def inventory(self, *, ages: bool = False) -> TierInventory:
        """What the index holds (store times are not recorded: `stored_at` is None)."""
        return ops.inventory(self._io, self.name, self.location)

    @classmethod
    def survey(cls, config: Mapping[str, Any], *, name: str = "",
               ages: bool = False) -> TierInventory:
        """Every namespace under the prefix, read-only (`ops.survey_store`)."""
        return ops.survey_store(settings_from(config), name or "redis")

    def verify_blocks(self, *, repair: bool = False,
                      progress: Progress | None = None) -> list[VerifyReport]:
        """Every block the index holds, re-read and re-checked, in pieces on the loop
        (`ops.verify_piece`); with `repair`, the bad ones leave the index."""
        items = self.index.items()
        bad: list[BadBlock] = []
        vanished = removed = 0
        for at in range(0, len(items), ops.PIECE):
            b, v, r = self.engine.run(ops.verify_piece(
                self._io, items[at:at + ops.PIECE], repair=repair))
            bad += b
            vanished += v
            removed += r
            if progress is not None:
                progress(min(at + ops.PIECE, len(items)), len(items))
        notes = (f"{self.deleted_at_start} damaged value(s) (bad header, key or length) "
                 "were deleted when the tier opened",) if self.deleted_at_start else ()
        return [VerifyReport(self.name, self.ctx.namespace.fingerprint, self.location,
                             checked=len(items), bad=tuple(bad), vanished=vanished,
                             removed_bytes=removed, notes=notes)]

    # -- the loop ---------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` in the background on the loop (call on the loop thread)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_close(self) -> None:
        """After every job: the start-up retry is cancelled, background deletes get
        `timeout_s`, then the client's connections close."""
        if self._retry is not None:
            self._retry.cancel()
            await asyncio.wait([self._retry])
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=self.settings.timeout_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        await self._io.client.aclose()
        self._io.copier.shutdown(wait=False)


def _is_auth(exc: ResponseError) -> bool:
    text = str(exc)
    return text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")) or "AUTH" in text

