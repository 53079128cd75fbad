"""`Transfers`: the load and store hooks of one `redis` tier (`AsyncJobHooks` for
the core's `AsyncJobEngine`), and what their requests share.

A unit of work is up to `BATCH_BYTES` of a job's consecutive keys: one MGET, or one
pipeline of SETs - one round trip - bounded by `timeout_s` and the job's deadline
(whichever is nearer), so a server that went away, or hangs, costs misses within
the deadline - never a hang. The slot bytes are read and written on a copier
thread, not on the loop: a pool access may be slow (a page fault, a test's gate)
and the loop must keep serving the other requests.

Loads: what `lookup` called a HIT was pinned at submit. The value's header must
name this key, this namespace and this block size, and the block's checksum is
verified on the bytes once they are in the slot. A value of another format or
namespace at our name is a miss, left alone; a damaged one (this format, this
key, bad checksum, cut short) fails `corrupt` and is deleted; a missing one
(expired, evicted by Redis's own maxmemory, lost by a server restart; MGET also
answers nil for a value of another type) is a miss. Each leaves the index.

Stores: the start hook reserves room in the index (evicting by policy; evicted
values are deleted in the background) and runs the new keys as items; the end hook
makes what was SET visible to `lookup`. A pipeline that timed out or lost its
connection may still be carried out by the server later: its keys are taken back
(`retract.Retractions`), and a new store of them waits for that. With `ttl_s`,
each SET carries a Redis expiry (`PX`), and the index remembers when it ends
(wall-clock ms).

Threads: built on the scheduler thread (the tier's constructor); `attach` once
the client exists on the loop; everything else on the loop thread, except the
functions `off_loop` runs on a copier thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from kvtiers.sdk import (
    AsyncJobHooks,
    BoundedIndex,
    ErrorCounts,
    FailureReason,
    Job,
    Outcome,
    Pins,
    Reservation,
    StatsRecorder,
    TierContext,
    end_pinned_load,
    reserve_store,
    run_off_loop,
    verify,
)
from redis.exceptions import RedisError, ResponseError

from kvtiers_redis import record
from kvtiers_redis.names import Names
from kvtiers_redis.retract import Retractions
from kvtiers_redis.settings import RedisSettings

__all__ = ["Transfers", "wall_ms"]

T = TypeVar("T")
#: what a request may fail with that is the server's or the network's, not a bug
EXPECTED = (RedisError, OSError, asyncio.TimeoutError)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class _Stored:
    room: Reservation[int]
    written: dict[int, int] = field(default_factory=dict)  # index -> expiry (ms, 0: none)


class Transfers:
    """`load` and `store` are the engine's hooks; `spawn` runs a background
    coroutine on the loop (the tier's, tracked there)."""

    client: aioredis.Redis  # set by `attach`, on the loop

    def __init__(self, ctx: TierContext, settings: RedisSettings, index: BoundedIndex[int],
                 names: Names, stats: StatsRecorder, errors: ErrorCounts,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]):
        self.ctx = ctx
        self.settings = settings
        self.index = index
        self.names = names
        self.stats = stats
        self.errors = errors
        self.spawn = spawn
        self.fingerprint = ctx.namespace.fingerprint
        self.block_bytes = ctx.block_bytes
        self.ttl_ms = int(settings.ttl_s * 1000) if settings.ttl_s > 0 else 0
        self.retractions = Retractions(names, errors, spawn)
        self.copier = ThreadPoolExecutor(max(1, settings.concurrency),
                                         thread_name_prefix=f"kvtiers-{ctx.name or 'redis'}-copy")
        self.load = AsyncJobHooks(block=self._load, batch=self._load_many, end=self._end_load)
        self.store = AsyncJobHooks(start=self._reserve, block=self._store,
                                   batch=self._store_many, end=self._end_store)

    def attach(self, client: aioredis.Redis) -> None:
        self.client = client

    # Shared by both kinds.

    def timeout(self, job: Job | None = None) -> float:
        """How long one request may take: `timeout_s`, or less where the job's
        deadline (on the tier's clock) is nearer."""
        limit = self.settings.timeout_s
        deadline = None if job is None else job.transfer.deadline
        if deadline is not None:
            limit = min(limit, max(1e-3, deadline - self.ctx.clock()))
        return limit

    async def request(self, job: Job, op: str, call: Awaitable[T]) -> T | FailureReason:
        """`call`'s result, or why it failed: `timeout` once the job's deadline has
        passed, else `io` (counted and logged once per kind, scrubbed)."""
        try:
            return await asyncio.wait_for(call, self.timeout(job))
        except EXPECTED as exc:
            return self.failure(job, op, exc)

    def failure(self, job: Job, op: str, exc: BaseException) -> FailureReason:
        """`timeout` once the job's deadline has passed, else `io` (recorded)."""
        if job.expired():
            return FailureReason.TIMEOUT
        self.errors.record(op, exc)
        return FailureReason.IO

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a copier thread (`kvtiers.sdk.run_off_loop`)."""
        return await run_off_loop(self.copier, fn, *args)

    def unlink_later(self, keys: list[bytes]) -> None:
        """Delete the values of `keys` in the background (on the loop thread)."""
        if keys:
            self.spawn(self.unlink([self.names.block(k) for k in keys]))

    async def unlink(self, names: list[bytes]) -> None:
        try:
            for at in range(0, len(names), 512):
                await asyncio.wait_for(self.client.unlink(*names[at:at + 512]), self.timeout())
        except EXPECTED as exc:  # a value left behind is found again at start-up
            self.errors.record("delete", exc)

    # Loads.

    async def _load(self, job: Job, i: int) -> Outcome:
        return (await self._load_many(job, [i]))[0]

    async def _load_many(self, job: Job, indices: Sequence[int]) -> list[Outcome]:
        """One MGET for a unit of the job's keys; the blocks placed on a copier thread."""
        pins: Pins[int] | None = job.state
        keys = job.keys
        out: list[Outcome] = [FailureReason.MISSING] * len(indices)
        held = [(n, i, loc) for n, i in enumerate(indices)
                if (loc := pins.locations[i] if pins is not None else self.index.get(keys[i]))
                is not None]
        if not held:
            return out
        values = await self.request(job, "load", self.client.mget(
            [self.names.block(keys[i]) for _, i, _ in held]))
        if isinstance(values, FailureReason):
            for n, _, _ in held:
                out[n] = values
            return out
        good: list[tuple[int, int, int, bytes]] = []
        broken: list[tuple[int, int]] = []
        for (n, i, location), found in zip(held, values, strict=True):
            key = keys[i]
            value = found if isinstance(found, bytes) else None
            # None: expired, evicted by the server, lost in its restart, or a value of
            # another type at our name (MGET answers nil for those).
            bad = None if value is None else record.check_header(
                value, self.fingerprint, key, self.block_bytes)
            if value is not None and bad is None:
                good.append((n, i, location, value))
            elif bad is record.Bad.BROKEN:
                broken.append((i, location))
                out[n] = FailureReason.CORRUPT
            else:
                if bad is not None:  # another program's value, another model's block
                    self.errors.note("load", bad.value, f"a value at a block's name is "
                                     f"{bad.value}: a miss, left alone")
                self.index.remove(key, location)
        placed = await self.off_loop(self._place, job, [(i, v) for _, i, _, v in good])
        for (n, i, location, _), outcome in zip(good, placed, strict=True):
            out[n] = outcome
            if outcome is FailureReason.CORRUPT:
                broken.append((i, location))
        if broken:
            # Ours and damaged: deleted before the index lets go of it, so that no store
            # of these keys can start writing while the damaged copy is still there.
            await self.request(job, "delete", self.client.unlink(
                *[self.names.block(keys[i]) for i, _ in broken]))
            for i, location in broken:
                self.index.remove(keys[i], location)
        return out

    def _place(self, job: Job, values: list[tuple[int, bytes]]) -> list[Outcome]:
        """Copy each block into its slot and verify it there (a copier thread). A slot
        that cannot be reached fails its key alone."""
        out: list[Outcome] = []
        for i, value in values:
            header = record.parse_header(value)
            assert header is not None  # check_header passed
            expected, start = header.block_sum, header.length
            try:
                dest = self.ctx.pool.block(job.slots[i])
            except OSError as exc:
                self.errors.record("load.slot", exc)
                out.append(FailureReason.IO)
                continue
            dest[:] = memoryview(value)[start:]
            out.append(None if verify(dest, expected) else FailureReason.CORRUPT)
        return out

    def _end_load(self, job: Job) -> None:
        end_pinned_load(self.index, job)

    # Stores.

    def _reserve(self, job: Job) -> list[int]:
        return reserve_store(self.index, job, self.block_bytes, plan=_Stored,
                             stats=self.stats, delete=self.unlink_later)

    async def _store(self, job: Job, i: int) -> Outcome:
        return (await self._store_many(job, [i]))[0]

    async def _store_many(self, job: Job, indices: Sequence[int]) -> list[Outcome]:
        """The unit's values made on a copier thread, then one pipeline of SETs."""
        plan: _Stored = job.state
        made = await self.off_loop(self._encode, job, indices)
        out: list[Outcome] = [FailureReason.IO] * len(indices)
        todo = [(n, i, v) for n, (i, v) in enumerate(zip(indices, made, strict=True))
                if v is not None]
        if not todo:
            return out
        keys = [job.keys[i] for _, i, _ in todo]
        if any(k in self.retractions for k in keys):
            # A late clean-up of an earlier store must not take the new values.
            waited = await self.request(job, "store", self.retractions.settled(keys))
            if isinstance(waited, FailureReason):
                return [waited] * len(indices)
        # Taken before the SETs: the index's expiry is never later than Redis's.
        expires = wall_ms() + self.ttl_ms if self.ttl_ms else 0
        pipe = self.client.pipeline(transaction=False)
        for _, i, value in todo:
            pipe.set(self.names.block(job.keys[i]), value, px=self.ttl_ms or None)
        done: list[Any] | FailureReason
        try:
            done = await asyncio.wait_for(pipe.execute(raise_on_error=False),
                                          self.timeout(job))
        except EXPECTED as exc:
            done = self.failure(job, "store", exc)
            if not isinstance(exc, ResponseError):  # it may land yet, uncounted
                self.retractions.retract(keys, lambda names: self.client.unlink(*names))
        for k, (n, i, _) in enumerate(todo):
            if isinstance(done, FailureReason):
                out[n] = done
            elif isinstance(done[k], Exception):
                self.errors.record("store", done[k])
            else:
                plan.written[i] = expires
                out[n] = None
        return out

    def _encode(self, job: Job, indices: Sequence[int]) -> list[bytes | None]:
        """The values of the unit's blocks (a copier thread); None for a slot that
        cannot be reached (its key fails alone)."""
        out: list[bytes | None] = []
        for i in indices:
            try:
                block = self.ctx.pool.block(job.slots[i])
            except OSError as exc:
                self.errors.record("store.slot", exc)
                out.append(None)
                continue
            out.append(record.encode(self.fingerprint, job.keys[i], block))
        return out

    def _end_store(self, job: Job) -> None:
        """What was SET becomes visible to lookup (only now: a HIT is always readable)."""
        plan: _Stored | None = job.state
        if plan is None:  # never started: timeout or closed
            return
        with plan.room as room:
            # In the job's order, whatever order the SETs ended in: a prefix's first
            # blocks are the older ones.
            done = [(job.keys[i], expires) for i, expires in sorted(plan.written.items())
                    if job.succeeded(i)]
            room.commit_many([k for k, _ in done], [e for _, e in done], close=True)
