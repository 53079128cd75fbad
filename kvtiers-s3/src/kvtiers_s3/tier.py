"""`S3Tier` (`{"type": "s3"}`) and `ObjTier` (`{"type": "obj"}`, vLLM's options):
KV-cache blocks as objects under one prefix of an object store - persistent,
shared by every engine that uses the prefix, verified, bounded by capacity_bytes.

Threads and what they may do:

- the scheduler thread calls `lookup`, `submit_*`, `touch`, `get_finished_jobs`,
  `stats`: dictionary work (`Holdings`), a hand-off to the loop, never I/O;
- the event loop of the core's `AsyncJobEngine` (one thread) runs every request:
  `concurrency` at once, loads ahead of stores (`jobs.loads.Loads`,
  `jobs.stores.Stores`), the deletes of evicted objects, the periodic listing
  (`rescan_s`) that counts what other engines stored, and start-up;
- the probe thread (`AsyncProbe`) answers lookups of keys this engine has not seen:
  a HEAD of each key's block object and a listing of segments not seen yet, run on
  the loop (the probe thread waits for it), then HIT or MISS.

Start-up lists the namespace prefix (`holdings.catalog.scan`: 100 000 blocks in a few
seconds, docs/tiers/s3.md) and applies the recency manifest written at the last
close. Capacity with several engines on one prefix: each counts every object it
has seen - its own, and others' found at start-up, by probes and by the listing
every `rescan_s` - and evicts by its policy, deleting others' objects too; between
two listings another engine's new objects are not counted yet, so the bound may be
exceeded by what the other engines store in `rescan_s`, and is restored by the
next listing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from kvtiers.errors import ConfigError, ConfigProblem, KvtiersError
from kvtiers.sdk import (
    AsyncJobEngine,
    AsyncProbe,
    BlockKey,
    EngineTier,
    ErrorCounts,
    LookupResult,
    Progress,
    StatsRecorder,
    TierContext,
    TierInventory,
    TierStats,
    TransferJob,
    VerifyReport,
    probed_lookup,
    resolve_options,
    type_name,
)

from kvtiers_s3.check import OBJ_PATHS, S3_PATHS, Paths, check_offline
from kvtiers_s3.client.bucket import ensure_bucket, set_ttl_rule
from kvtiers_s3.client.connect import open_filesystem
from kvtiers_s3.client.objects import ObjectInfo, ObjectStore, describe
from kvtiers_s3.holdings.catalog import (
    BROKEN,
    Scan,
    block_object,
    judge_block,
    read_recency,
    scan,
    write_namespace,
    write_recency,
)
from kvtiers_s3.holdings.index import Holdings, StoredObject, segment_oid
from kvtiers_s3.jobs.iocontext import IoContext
from kvtiers_s3.jobs.latency import RequestLatency
from kvtiers_s3.jobs.loads import LoadPlan, Loads
from kvtiers_s3.jobs.stores import StorePlan, Stores
from kvtiers_s3.layout import codec
from kvtiers_s3.layout.names import SEGMENTS, block_name, namespace_root, parse_name
from kvtiers_s3.schema import OBJ_SCHEMA, S3_SCHEMA
from kvtiers_s3.settings import S3Settings, settings_from_obj, settings_from_s3
from kvtiers_s3.tools.survey import held, survey_store
from kvtiers_s3.tools.verify import verify_namespace

__all__ = ["ObjTier", "S3Tier"]

STARTUP_TIMEOUT_S = 300.0
PROBE_HEADS = 32  # HEADs in flight for one probe batch
SEGMENT_LIST_EVERY_S = 1.0  # a probe lists new segments at most this often


class S3Tier(EngineTier):
    """See the module doc; config: `kvtiers_s3.schema.S3_SCHEMA`. `EngineTier`
    gives `get_finished_jobs` and `drain`."""

    engine: AsyncJobEngine
    persistent = True
    shared = True  # per instance: `shared: false` turns it off
    serves_peers = False
    verifies = True

    SCHEMA: ClassVar[Mapping[str, Any]] = S3_SCHEMA
    FORM: ClassVar[str] = "s3"
    PATHS: ClassVar[Paths] = S3_PATHS

    @classmethod
    def resolve(cls, options: Mapping[str, Any]) -> S3Settings:
        return settings_from_s3(options)

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        options = resolve_options(self.SCHEMA, config, self.FORM)
        settings = self.resolve(options)
        problems = check_offline(settings, self.PATHS, self.FORM)
        if problems:
            raise ConfigError(problems)
        super().__init__(ctx, options)
        self.settings = settings
        self.name = ctx.name or self.FORM
        self.shared = settings.shared
        self.ns_root = namespace_root(settings.root, ctx.namespace.fingerprint)
        self.capacity_bytes = settings.capacity_bytes
        self._stats = StatsRecorder(capacity_bytes=settings.capacity_bytes)
        self._errors = ErrorCounts(
            ctx.logger, f"kvtiers-s3 {self.name}", scrub=settings.scrub, kind=type_name,
            describe=lambda exc: describe(exc, settings))
        record = codec.header_bytes(36) + ctx.block_bytes
        self._holdings = Holdings(ctx, policy=settings.eviction_policy,
                                  capacity_bytes=settings.capacity_bytes, entry_bytes=record)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._io = IoContext(ctx, settings, self._holdings, self.ns_root, self._stats,
                             self._errors, self._spawn)
        loads = max(1, settings.concurrency // 2)
        self.engine = AsyncJobEngine(
            ctx, load=Loads(self._io).hooks, store=Stores(self._io).hooks,
            load_concurrency=loads, store_concurrency=max(1, settings.concurrency - loads),
            stats=self._stats, on_close=self._on_close, name=f"kvtiers-{self.name}",
            on_crash=lambda exc: self._errors.record("task", exc))
        self._probe: AsyncProbe | None = None
        self._rescan: concurrent.futures.Future[None] | None = None
        self._segments_listed = 0.0
        self.startup: Scan | None = None
        #: wall-clock time that `ttl_s` is measured on (objects carry store times)
        self.wall_clock: Callable[[], float] = time.time
        try:
            # A client for the loop; extra connections for probes, listings, deletes.
            fs = open_filesystem(settings, loop=self.engine.loop,
                                 **({"max_pool_connections": settings.concurrency + 8}
                                    if settings.is_s3 else {}))
            self._store = ObjectStore(
                fs, settings,
                boto3_threads=settings.concurrency + 8 if settings.uses_boto3 else 0)
            self._io.attach(self._store)
            scanned = self.engine.run(self._start(), timeout=STARTUP_TIMEOUT_S)
        except BaseException:
            self.engine.close(timeout=1.0)
            raise
        if self.shared:
            self._probe = AsyncProbe(self._probe_keys, clock=ctx.clock, hit_ttl_s=0.0,
                                     miss_ttl_s=1.0, name=f"kvtiers-{self.name}-probe")
        period = settings.rescan_s if self.shared else 0.0
        if not scanned:  # the server was away: list it once it answers
            period = settings.rescan_s or 10.0
        if period > 0:
            self._rescan = asyncio.run_coroutine_threadsafe(
                self._rescan_every(period, once=not self.shared), self.engine.loop)

    # -- start-up (on the loop) ----------------------------------------------------------

    async def _start(self) -> bool:
        """Bucket, lifecycle rule, NAMESPACE.json, the listing. False when the server
        did not answer (the tier starts empty and lists later); a missing bucket or
        denied access is a ConfigError."""
        settings = self.settings
        loop = asyncio.get_running_loop()
        try:
            if settings.is_s3 and settings.create_bucket and await loop.run_in_executor(
                    None, ensure_bucket, settings):
                self.ctx.logger.info("kvtiers-s3 %s: created bucket %s", self.name,
                                     settings.bucket)
            if settings.is_s3 and settings.ttl_s:
                why = await loop.run_in_executor(
                    None, set_ttl_rule, settings, self.ns_root.partition("/")[2],
                    self.ctx.namespace.fingerprint, settings.ttl_s)
                if why:
                    self.ctx.logger.info("kvtiers-s3 %s: %s", self.name, why)
            await write_namespace(self._store, self.ns_root, self.ctx.namespace)
            await self._adopt_scan(await self._scan(), restore=True)
        except (FileNotFoundError, PermissionError) as exc:
            what = "does not exist" if isinstance(exc, FileNotFoundError) else "is not writable"
            raise ConfigError(ConfigProblem(self.PATHS.url, (
                f"{self.FORM} tier: {settings.url} {what} with these settings "
                f"({describe(exc, settings)})"))) from None
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - an absent server costs misses, not a crash
            self._errors.record("start", exc)
            return False
        return True

    async def _scan(self, kinds: tuple[str, ...] | None = None) -> Scan:
        def held(info: ObjectInfo) -> bool:
            return self._held_name(info.name) or self._judged(info)

        if kinds is None:
            return await scan(self._store, self.ns_root, self.ctx.namespace.fingerprint,
                              self.ctx.block_bytes, known=held)
        return await scan(self._store, self.ns_root, self.ctx.namespace.fingerprint,
                          self.ctx.block_bytes, known=held, kinds=kinds)

    def _held_name(self, name: str) -> bool:
        """Whether the object listed as `name` is the one held (no need to read it)."""
        if name in self._io.deleting:  # as good as gone: never taken back in
            return True
        parsed = parse_name(self.ns_root, name)
        if parsed is None:
            return False
        oid = parsed.key if parsed.key is not None else segment_oid(name)
        obj = self._holdings.index.get(oid)
        return obj is not None and obj.name == name

    def _judged(self, info: ObjectInfo) -> bool:
        """Whether the object `info` describes failed verification and has not changed
        since (`holdings.verdicts`): left out of probes and listings, a miss. One
        that changed is judged afresh (a quarantined one let go, undeleted)."""
        if self._io.verdicts.judge(info) is not None:
            return True
        self._holdings.release(info.name)
        return False

    async def _adopt_scan(self, found: Scan, *, restore: bool = False) -> None:
        now, ttl = self.wall_clock(), self.settings.ttl_s
        doomed = list(found.bad)
        for info, reason in found.others:
            doomed += self._quarantine(info, reason)
        for obj in found.objects:
            if ttl and obj.mtime + ttl < now:
                doomed.append(obj.name)
                continue
            doomed += [o.name for o in self._holdings.add(obj)]
        if restore:
            self.startup = found
            order = await read_recency(self._store, self.ns_root)
            with contextlib.suppress(ValueError):
                self._holdings.index.restore(order)
            self.ctx.logger.info(
                "kvtiers-s3 %s: %s holds %d blocks in %d objects (%d bytes), listed in "
                "%.2f s; %d broken objects deleted, %d not provably ours left alone "
                "(counted as used)", self.name, self.settings.url, len(self._holdings),
                len(found.objects), self._holdings.index.committed_bytes, found.seconds,
                len(found.bad), len(found.others))
        if doomed:
            self._io.delete_names(doomed)

    def _quarantine(self, info: ObjectInfo, reason: codec.Reason) -> list[str]:
        """An object a listing or probe found not ours to read: remembered (not read
        again until it changes), counted, never deleted, reported. Returns the names
        of objects evicted to make room for it (delete them)."""
        self._io.verdicts.remember(info, reason)
        if self._holdings.quarantined(info.name) is not None:
            return []
        self._errors.note("scan", reason.value, f"{info.name}: {reason.value}, not provably "
                                                "ours; never deleted, counted as used")
        gone = self._holdings.quarantine_found(info.name, info.size, info.mtime, info.etag)
        self._stats.evicted(len(gone))
        return [o.name for o in gone]

    async def _rescan_every(self, period: float, once: bool) -> None:
        """Count what other engines stored, and let go of what they deleted."""
        while True:
            await asyncio.sleep(period)
            try:
                started = time.time()
                found = await self._scan()
                await self._adopt_scan(found)
                for obj in self._holdings.objects():
                    if obj.name not in found.listed and obj.mtime < started - 1:
                        self._holdings.drop(obj)  # deleted behind us
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                self._errors.record("rescan", exc)
                continue
            if once:
                return

    # -- scheduler side: memory only ------------------------------------------------------

    def lookup(self, key: BlockKey) -> LookupResult:
        if self._closed:
            return LookupResult.MISS
        obj = self._holdings.lookup(key)
        held = False
        if obj is not None:
            ttl = self.settings.ttl_s
            held = not ttl or obj.mtime + ttl >= self.wall_clock()
            if not held:
                self.engine.loop.call_soon_threadsafe(self._expire, obj)
        return probed_lookup(key, held, self._probe, self._stats)

    def submit_store(self, job: TransferJob) -> None:
        self.engine.submit_store(job, StorePlan())

    def submit_load(self, job: TransferJob) -> None:
        if self._closed:
            self.engine.submit_load(job, LoadPlan(None, []))
            return
        pins, objects = self._holdings.pin(job.keys)  # what lookup called a HIT stays
        self.engine.submit_load(job, LoadPlan(pins, objects))

    def touch(self, keys: Iterable[BlockKey]) -> None:
        if not self._closed:
            self._holdings.touch(keys)

    def stats(self) -> TierStats:
        snap = self._stats.snapshot(usage_bytes=self._holdings.index.committed_bytes)
        snap.errors.update({f"s3.{k}": v for k, v in self._errors.snapshot().items()})
        return snap

    def request_latency(self) -> dict[str, dict[str, Any]]:
        """Per request, not per job: the p50/p99/max milliseconds of the GETs of
        load jobs and the PUTs of store jobs so far (`jobs.latency.RequestLatency`;
        any thread)."""
        return self._io.latency.summary()

    @property
    def latency(self) -> RequestLatency:
        """Each request's time (`jobs.latency.RequestLatency`), for tools and benches."""
        return self._io.latency

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._rescan is not None:
            self._rescan.cancel()
        if self._probe is not None:
            self._probe.close()
        order = self._holdings.index.export()
        if order:
            try:
                self.engine.run(asyncio.wait_for(
                    write_recency(self._store, self.ns_root, order), self.settings.timeout_s))
            except Exception as exc:  # noqa: BLE001 - recency is advisory
                self._errors.record("recency", exc)
        self.engine.close(timeout=self.settings.timeout_s)

    # -- tools (`kvtiers inspect` / `verify` / `snapshot`): any thread but the scheduler's --

    @classmethod
    def survey(cls, config: Mapping[str, Any], *, name: str = "",
               ages: bool = False) -> TierInventory:
        """Every namespace under the prefix, read-only, without building the tier
        (`tools.survey`)."""
        settings = cls.resolve(resolve_options(cls.SCHEMA, config, cls.FORM))
        try:
            return survey_store(settings, name or cls.FORM, ages=ages)
        except Exception as exc:  # noqa: BLE001 - worded for the user, scrubbed
            raise KvtiersError(f"{cls.FORM} tier {name or cls.FORM}: {settings.url} cannot "
                               f"be listed ({describe(exc, settings)})") from None

    def inventory(self, *, ages: bool = False) -> TierInventory:
        """What the index holds, in its eviction order (`tools.survey.held`)."""
        return held(self._holdings, self.ctx, self.settings, self.name, self.ns_root)

    def verify_blocks(self, *, repair: bool = False,
                      progress: Progress | None = None) -> list[VerifyReport]:
        """Every held object re-read and re-checked (`tools.verify`); with `repair`,
        damaged objects that are provably ours leave the index and the store."""
        return verify_namespace(self.engine.run, self._io, self.startup, self.name,
                                repair=repair, progress=progress)

    # -- helpers ----------------------------------------------------------------------------

    def object_name(self, key: BlockKey) -> str | None:
        """The object holding `key` (tests, tools), or None."""
        obj = self._holdings.lookup(key)
        return None if obj is None else obj.name

    def held_object(self, key: BlockKey) -> StoredObject | None:
        return self._holdings.lookup(key)

    def quarantined(self) -> list[str]:
        """The objects at names the tier makes that it cannot prove its own (tests,
        tools): never read again until they change, never deleted, counted as used
        (`holdings.index`)."""
        return self._holdings.quarantined_names()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` in the background on the loop (call on the loop thread)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _expire(self, obj: StoredObject) -> None:
        if self._holdings.drop(obj):
            self._io.delete_later([obj])

    async def _on_close(self) -> None:
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=self.settings.timeout_s)
            for task in late:  # a delete still waiting for an absent server
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=self.settings.timeout_s)
        await self._store.close()
        self._io.copier.shutdown(wait=False)

    # -- the probe thread ------------------------------------------------------------------

    def _probe_keys(self, keys: Sequence[BlockKey]) -> list[BlockKey]:
        try:
            return self.engine.run(self._probe_on_loop(list(keys)),
                                    timeout=self.settings.timeout_s + 5)
        except Exception as exc:  # noqa: BLE001 - a failed probe is a miss
            self._errors.record("probe", exc)
            return []

    async def _probe_on_loop(self, keys: list[BlockKey]) -> list[BlockKey]:
        todo = [k for k in keys if self._holdings.lookup(k) is None]
        sem = asyncio.Semaphore(PROBE_HEADS)
        bb, fingerprint = self.ctx.block_bytes, self.ctx.namespace.fingerprint

        async def head(key: BlockKey) -> StoredObject | None:
            name = block_name(self.ns_root, key)
            if name in self._io.deleting:
                return None
            async with sem:
                info = await self._store.info(name)
            if info is None:
                self._holdings.release(name)  # a quarantined object went: let it go
                return None
            if name in self._io.deleting or self._judged(info):
                return None
            obj = block_object(info, key, bb)
            if obj is None:  # not a record's size: whose is it? (as at start-up)
                try:
                    reason = await judge_block(self._store, info, key, fingerprint)
                except FileNotFoundError:
                    return None
                except Exception as exc:  # noqa: BLE001 - a miss; the next probe asks again
                    self._errors.record("probe", exc)
                    return None
                self._io.delete_names([name] if reason in BROKEN
                                      else self._quarantine(info, reason))
            return obj

        timeout = self.settings.timeout_s
        found = await asyncio.wait_for(asyncio.gather(*(head(k) for k in todo)), timeout)
        doomed = []
        for obj in found:
            if obj is not None:
                doomed += self._holdings.add(obj)
        now = time.monotonic()
        if todo and now - self._segments_listed >= SEGMENT_LIST_EVERY_S:
            self._segments_listed = now
            await asyncio.wait_for(self._adopt_scan(await self._scan((SEGMENTS,))), timeout)
        if doomed:
            self._io.delete_later(doomed)
        return [k for k in keys if self._holdings.lookup(k) is not None]


class ObjTier(S3Tier):
    """vLLM's object store tier's options (`store_config`, `prefix`, `io_threads`),
    on the s3 tier; config: `kvtiers_s3.schema.OBJ_SCHEMA`."""

    SCHEMA = OBJ_SCHEMA
    FORM = "obj"
    PATHS = OBJ_PATHS

    @classmethod
    def resolve(cls, options: Mapping[str, Any]) -> S3Settings:
        return settings_from_obj(options)
