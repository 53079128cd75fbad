"""`FsTier` (`{"type": "fs"}`): blocks as files under one or several root
directories - persistent, shared by every process that opens the same roots,
verified, crash-safe, bounded per root.

Threads and what they may do:

- the scheduler thread calls `lookup`, `submit_*`, `touch`, `get_finished_jobs`,
  `stats`: dictionary work only (the in-memory index of each root), never I/O;
- I/O threads (the core's `kvtiers.sdk.JobEngine`, on its dual-queue pool) run
  one work item per block (one unit per 1 MiB of consecutive blocks of a job, for
  blocks smaller than that) - `pwritev`/`preadv` straight from/to the pool slot,
  checksums included - after a store job's start hook, which reserves room in the
  shared journal; a store job's block items go to the head of the store queue, so
  that its writes start while later jobs reserve; its end hook commits; an item of a
  block another writer has in flight defers (`job.defer`) instead of waiting on its
  thread, and is settled - or run again to write the block - when that write ends;
- the probe thread (`AsyncProbe`) answers lookups of keys this process has not seen
  yet: it reads what other processes appended to the journal, then looks again.

A job is reported once every item of it has returned, so no I/O of this tier can
touch its slots afterwards. An item taken after its job's deadline fails with
`timeout` without any I/O. Failures are per key, counted, logged once per kind; an
exception never leaves the tier.

Layout and block files: `kvtiers_fs.disk`; the shared index (journal, snapshots,
crash recovery): `kvtiers_fs.journal`; capacity across processes:
`kvtiers_fs.namespace.store`; `kvtiers inspect` and `verify`: `kvtiers_fs.tools`.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvtiers.errors import ConfigError, ConfigProblem
from kvtiers.sdk import (
    AsyncProbe,
    BlockKey,
    Deferred,
    EngineTier,
    ErrorCounts,
    FailureReason,
    Job,
    JobEngine,
    JobHooks,
    LookupResult,
    Outcome,
    Pins,
    Progress,
    StatsRecorder,
    TierContext,
    TierInventory,
    TierStats,
    TransferJob,
    VerifyReport,
    probed_lookup,
    resolve_options,
)

from kvtiers_fs.disk import layout
from kvtiers_fs.disk.blockio import BlockIO, ReadOutcome, ReadResult, probe_o_direct
from kvtiers_fs.disk.layout import Ident
from kvtiers_fs.namespace.listing import list_namespaces
from kvtiers_fs.namespace.store import RootStore
from kvtiers_fs.namespace.write_verdict import WriteVerdict
from kvtiers_fs.schema import FS_SCHEMA, check_options, room_warnings, root_dirs

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


_WAIT_FAILURES = {WriteVerdict.FULL: FailureReason.FULL,
                  WriteVerdict.TIMEOUT: FailureReason.TIMEOUT,
                  WriteVerdict.CLOSED: FailureReason.CLOSED}


def _store_failure(exc: OSError) -> FailureReason:
    return FailureReason.FULL if exc.errno in _FULL_ERRNOS else FailureReason.IO


class _Plan:
    """The fs tier's part of a job in flight (`Job.state`): where each key lives
    (loads: routed and pinned at submit) and, for a store, the blocks it writes.

    A store's `writes` gains entries after its start hook only from the wait
    thread (a block another writer gave up, now reserved for this job); `lock` and
    `ended` order that against the end hook, so that every reservation is either
    seen by the end hook (committed or aborted there) or aborted by the wait."""

    __slots__ = ("routes", "pins", "writes", "waits", "lock", "ended")

    def __init__(self, routes: list[tuple[int, Ident]] | None = None):
        self.routes = routes or []
        self.pins: list[Pins[int]] = []  # loads: what lookup called a HIT, per root
        # stores: job index -> (root, ident, recycled: into an evicted block's file)
        self.writes: dict[int, tuple[int, Ident, bool]] = {}
        # stores: job index -> (root, ident) of a block another intent is writing
        self.waits: dict[int, tuple[int, Ident]] = {}
        self.lock = threading.Lock()
        self.ended = False


#: block items are batched up to this many bytes per pool task (one block at least)
BATCH_BYTES = 1 << 20


class FsTier(EngineTier):
    """See the module doc; config: `kvtiers_fs.schema.FS_SCHEMA`. `EngineTier` gives
    `get_finished_jobs` and `drain`."""

    engine: JobEngine
    persistent = True
    shared = True  # the class's default; `shared: false` turns it off
    serves_peers = False
    verifies = True

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        options = resolve_options(FS_SCHEMA, config, "fs")
        problems = check_options(options)
        if problems:
            raise ConfigError(problems)
        super().__init__(ctx, options)
        name = ctx.name or "fs"
        self.roots = root_dirs(options)
        self.capacity_bytes: int = options["capacity_bytes"]
        self.durable: bool = bool(options["durable"])
        threads = options["threads"]
        self._errors = ErrorCounts(ctx.logger, f"kvtiers-fs {name}")
        self._stats = StatsRecorder(capacity_bytes=self.capacity_bytes * len(self.roots))
        self.namespace = ctx.namespace.fingerprint
        self.block_bytes = ctx.block_bytes
        self.file_bytes = layout.file_bytes(ctx.block_bytes)
        policy_name = options["eviction_policy"]
        capacity_blocks = max(1, self.capacity_bytes // self.file_bytes)
        self.stores: list[RootStore] = []
        self._io: list[BlockIO] = []
        try:
            for root in self.roots:
                store = RootStore(
                    root, ctx.namespace, capacity_bytes=self.capacity_bytes,
                    policy_factory=lambda: ctx.make_policy(policy_name, capacity_blocks),
                    durable=self.durable, errors=self._errors, logger=ctx.logger,
                    on_removed=ctx.events.removed,
                )
                self.stores.append(store)
                store.open()
                self._io.append(BlockIO(self.namespace, self.block_bytes,
                                        o_direct=self._o_direct(store, options["o_direct"]),
                                        durable=self.durable))
        except BaseException:
            for store in self.stores:
                store.close()
            raise
        self._closed = False
        self.engine = JobEngine(
            ctx,
            load=JobHooks(block=self._load_block, batch=self._load_batch, end=self._end_load),
            store=JobHooks(start=self._prepare_store, block=self._store_block,
                           end=self._end_store),
            load_threads=threads["load"], store_threads=threads["store"],
            stats=self._stats, batch_bytes=BATCH_BYTES, name=f"kvtiers-{name}",
            on_crash=lambda exc: self._errors.record("task", exc),
        )
        # Capability flag, per instance: a private root needs no probes.
        self.shared = bool(config.get("shared", True))
        self._probe = AsyncProbe(self._probe_keys, clock=ctx.clock, hit_ttl_s=0.0,
                                 miss_ttl_s=1.0, name=f"kvtiers-{name}-probe")
        self._log_neighbours()
        for warning in room_warnings(self.roots, self.capacity_bytes, self.file_bytes):
            ctx.logger.warning("kvtiers-fs %s: %s", name, warning)

    def _o_direct(self, store: RootStore, mode: Any) -> bool:
        if mode is False:
            return False
        supported = probe_o_direct(store.blocks_fd)
        if mode is True and not supported:
            store.close()
            raise ConfigError([ConfigProblem(
                "$.o_direct", f"fs tier: the filesystem of {store.root!r} does not support "
                "O_DIRECT; use \"auto\" (buffered there) or false")])
        if not supported:
            self.ctx.logger.info("kvtiers-fs %s: no O_DIRECT here; buffered I/O", store.root)
        return supported

    def _log_neighbours(self) -> None:
        for root in self.roots:
            try:
                others = list_namespaces(root, exclude=self.namespace, counts=False)
            except OSError:
                continue
            if others:
                self.ctx.logger.info(
                    "kvtiers-fs %s: other namespaces here (left alone): %s", root,
                    "; ".join(str(n) for n in others))

    # -- scheduler side: memory only -------------------------------------------

    def _route(self, key: BlockKey) -> tuple[int, Ident]:
        idn = layout.ident(key)
        return layout.route(idn, len(self.stores)), idn

    def lookup(self, key: BlockKey) -> LookupResult:
        if self._closed:
            return LookupResult.MISS
        root, idn = self._route(key)
        # Shared: another process may have stored it since we last read the journal.
        return probed_lookup(key, self.stores[root].contains(idn),
                             self._probe if self.shared else None, self._stats)

    def submit_store(self, job: TransferJob) -> None:
        self.engine.submit_store(job, _Plan())

    def submit_load(self, job: TransferJob) -> None:
        plan = _Plan([self._route(key) for key in job.keys])
        if not self._closed:  # what lookup called a HIT stays until loaded
            by_root: dict[int, list[Ident]] = {}
            for root, idn in plan.routes:
                by_root.setdefault(root, []).append(idn)
            plan.pins = [self.stores[root].pin(idns) for root, idns in by_root.items()]
        self.engine.submit_load(job, plan)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.engine.close()
        self._probe.close()
        for store in self.stores:
            store.close()

    def stats(self) -> TierStats:
        usage = sum(store.stats()[0] for store in self.stores)
        snap = self._stats.snapshot(usage_bytes=usage)
        snap.errors.update({f"os.{k}": v for k, v in self._errors.snapshot().items()})
        return snap

    def touch(self, keys: Iterable[BlockKey]) -> None:
        if self._closed:
            return
        by_root: dict[int, list[Ident]] = {}
        for key in keys:
            root, idn = self._route(key)
            by_root.setdefault(root, []).append(idn)
        for root, idns in by_root.items():
            self.stores[root].touch(idns)

    def inventory(self, *, ages: bool = False) -> TierInventory:
        return TierInventory(self.ctx.name or "fs",
                             tuple(store.inventory(ages=ages) for store in self.stores))

    @classmethod
    def survey(cls, config: Mapping[str, Any], *, name: str = "",
               ages: bool = False) -> TierInventory:
        """Every namespace under the roots, read-only (`kvtiers_fs.tools.survey`)."""
        from kvtiers_fs.tools.survey import survey

        options = resolve_options(FS_SCHEMA, config, "fs")
        return TierInventory(name or "fs", tuple(survey(
            root_dirs(options), capacity_bytes=options["capacity_bytes"], ages=ages)))

    def verify_blocks(self, *, repair: bool = False,
                      progress: Progress | None = None) -> list[VerifyReport]:
        """Every block of this namespace, re-read and re-checked (`kvtiers_fs.tools.verify`)."""
        from kvtiers_fs.tools.verify import verify_tier

        return verify_tier(self.stores, self.ctx.name or "fs", self.file_bytes,
                           repair=repair, progress=progress)

    def block_path(self, key: BlockKey) -> str:
        """Where the file of `key` is (tests, tools)."""
        root, idn = self._route(key)
        return "/".join([self.roots[root], self.namespace, "blocks",
                         layout.block_relpath(idn)])

    @property
    def o_direct(self) -> list[bool]:
        return [io.o_direct for io in self._io]

    # -- I/O threads ---------------------------------------------------------------

    def _prepare_store(self, job: Job) -> list[int]:
        """Start hook of a store job: reserve room (one journal frame per root); the
        blocks to write are its items. (The engine checked the deadline.)"""
        plan: _Plan = job.state
        by_root: dict[int, list[tuple[int, Ident]]] = {}
        for i, key in enumerate(job.keys):
            root, idn = self._route(key)
            by_root.setdefault(root, []).append((i, idn))
        items: list[int] = []
        for root, entries in by_root.items():
            store = self.stores[root]
            try:
                verdicts, evicted = store.reserve([(idn, self.file_bytes) for _, idn in entries])
            except OSError as exc:
                self._errors.record("reserve", exc, store.root)
                for i, _ in entries:
                    job.fail(i, _store_failure(exc))
                continue
            if evicted:
                self._stats.evicted(evicted)
            for (i, idn), verdict in zip(entries, verdicts, strict=True):
                if verdict is WriteVerdict.PRESENT:
                    job.succeed(i)
                elif verdict is WriteVerdict.FULL:
                    job.fail(i, FailureReason.FULL)
                elif verdict is WriteVerdict.PENDING:  # another intent is writing it: wait
                    plan.waits[i] = (root, idn)
                    items.append(i)
                else:
                    plan.writes[i] = (root, idn, verdict is WriteVerdict.RECYCLED)
                    items.append(i)
        # The engine puts them at the head of the queue: with many store jobs queued,
        # the reservations (one at a time, under the namespace lock) would otherwise
        # all run before any block is written, leaving the disk idle meanwhile.
        return items

    def _store_block(self, job: Job, i: int) -> Outcome:
        plan: _Plan = job.state
        if i in plan.waits and i not in plan.writes:
            return self._await_other_writer(job, i)
        root, idn, recycled = plan.writes[i]
        store, key = self.stores[root], job.keys[i]
        try:
            shard = store.shard_fd(idn, create=True)
            try:
                self._io[root].write(shard, idn, key, store.writer,
                                     self.ctx.pool.block(job.slots[i]), recycled=recycled)
            finally:
                layout.close_quiet(shard)
        except OSError as exc:
            self._errors.record("store", exc, store.root)
            return _store_failure(exc)
        return None

    def _await_other_writer(self, job: Job, i: int) -> Deferred:
        """A block another intent (another process, another job) is writing: defer
        the key (the I/O thread moves on) until that intent ends
        (`RootStore.await_intent`, on the store's wait thread; bounded by the job's
        deadline, by `MAX_WAIT_S` and by close). Success only if its copy was
        committed; if it failed and room was left, the reservation is this job's:
        the item runs again and writes the block."""
        root, idn = job.state.waits[i]
        deferred = job.defer(i)
        self.stores[root].await_intent(
            idn, self.file_bytes, job.transfer.deadline, self.ctx.clock,
            lambda verdict: self._other_writer_ended(job, i, deferred, verdict))
        return deferred

    def _other_writer_ended(self, job: Job, i: int, deferred: Deferred,
                            verdict: WriteVerdict) -> None:
        """Wait thread (or close): the other intent on key `i`'s block has ended."""
        if verdict is WriteVerdict.PRESENT:
            deferred.succeed(0)  # another writer's complete copy: nothing moved
            return
        if verdict not in (WriteVerdict.GRANTED, WriteVerdict.RECYCLED):
            deferred.fail(_WAIT_FAILURES.get(verdict, FailureReason.IO))
            return
        # Reserved for this job now. The end hook commits or aborts it if it has not
        # run yet (whether the item gets to write it or the deadline comes first).
        plan: _Plan = job.state
        root, idn = plan.waits[i]
        with plan.lock:
            if not plan.ended:
                plan.writes[i] = (root, idn, verdict is WriteVerdict.RECYCLED)
        if i in plan.writes:
            deferred.resume()
            return
        try:  # the job has ended (deadline, close): give the reservation back
            self.stores[root].commit([], [idn])
        except OSError as exc:
            self._errors.record("commit", exc, self.stores[root].root)

    def _load_block(self, job: Job, i: int) -> Outcome:
        root, idn = job.state.routes[i]
        store, key = self.stores[root], job.keys[i]
        io, slot = self._io[root], self.ctx.pool.block(job.slots[i])
        try:
            # One openat2 of <shard>/<file> where the kernel has it; the two-step
            # open (shard directory, then file) otherwise, and to classify errors.
            got = io.read_beneath(store.blocks_fd, idn, key, slot)
        except OSError as exc:
            return self._load_failed(store, idn, exc)
        if got is None:
            try:
                shard = store.shard_fd(idn, create=False)
            except FileNotFoundError:
                self._missing(store, idn)
                return FailureReason.MISSING
            except OSError as exc:
                return self._load_failed(store, idn, exc)
            try:
                got = io.read(shard, idn, key, slot)
            except OSError as exc:
                return self._load_failed(store, idn, exc)
            finally:
                layout.close_quiet(shard)
        return self._after_read(job, i, got)

    def _load_failed(self, store: RootStore, idn: Ident, exc: OSError) -> Outcome:
        self._errors.record("load", exc, store.root)
        store.unreadable(idn, exc)  # not a HIT for ever
        return FailureReason.IO

    def _load_batch(self, job: Job, indices: Sequence[int]) -> list[Outcome]:
        """Loads of consecutive small blocks of one job: one native call reads them
        all (`BlockIO.read_many`); a block it does not settle takes `_load_block`."""
        routes = job.state.routes
        out: dict[int, Outcome] = {}
        by_root: dict[int, list[int]] = {}
        for i in indices:
            by_root.setdefault(routes[i][0], []).append(i)
        for root, group in by_root.items():
            items = [(routes[i][1], job.keys[i], self.ctx.pool.block(job.slots[i]))
                     for i in group]
            try:
                results = self._io[root].read_many(self.stores[root].blocks_fd, items)
            except OSError:
                results = [None] * len(group)
            for i, got in zip(group, results, strict=True):
                out[i] = self._load_block(job, i) if got is None else self._after_read(job, i, got)
        return [out[i] for i in indices]

    def _after_read(self, job: Job, i: int, got: ReadResult) -> Outcome:
        root, idn = job.state.routes[i]
        store, key = self.stores[root], job.keys[i]
        if got.outcome is ReadOutcome.OK:
            return None
        if got.outcome is ReadOutcome.MISSING:
            self._missing(store, idn)
            return FailureReason.MISSING
        if got.outcome is ReadOutcome.FOREIGN:
            # Intact, but another version's or namespace's: never data, never deleted.
            self._errors.note("load", "foreign", f"{self.block_path(key)}: {got.why}")
            self._forget(store, idn)
            return FailureReason.MISSING
        self._errors.note("load", "corrupt", f"{self.block_path(key)}: {got.why}; removed")
        self._drop(store, idn, delete_file=True)
        return FailureReason.CORRUPT

    def _missing(self, store: RootStore, idn: Ident) -> None:
        """The file is gone: evicted by another process (we will read its REMOVE), or
        removed behind our back (then we forget it)."""
        if not store.contains(idn):
            return
        try:
            store.sync()
        except OSError:
            return
        if store.contains(idn):
            self._forget(store, idn)

    def _forget(self, store: RootStore, idn: Ident) -> None:
        try:
            store.forget_unless_present(idn)
        except OSError as exc:
            self._errors.record("remove", exc, store.root)

    def _drop(self, store: RootStore, idn: Ident, *, delete_file: bool) -> None:
        try:
            store.remove(idn, delete_file=delete_file)
        except OSError as exc:
            self._errors.record("remove", exc, store.root)

    def _end_load(self, job: Job) -> None:
        """End hook of a load: unpin its keys, touch those that were read."""
        plan: _Plan = job.state
        if not plan.pins:
            return
        for pins in plan.pins:
            pins.release()
        touched: dict[int, list[Ident]] = {}
        for i, (root, idn) in enumerate(plan.routes):
            if job.succeeded(i):
                touched.setdefault(root, []).append(idn)
        for root, idns in touched.items():
            self.stores[root].touch(idns)
            try:
                self.stores[root].flush_touches()
            except OSError as exc:
                self._errors.record("touch", exc)

    def _end_store(self, job: Job) -> None:
        """End hook of a store: commit the blocks written, abort the other intents."""
        plan: _Plan = job.state
        with plan.lock:  # from now on a wait that reserves gives its reservation back
            plan.ended = True
            writes = sorted(plan.writes.items())
        done: dict[int, list[tuple[int, Ident]]] = {}
        aborted: dict[int, list[Ident]] = {}
        # In the job's order, not the threads': a prefix's first blocks are older.
        for i, (root, idn, _) in writes:
            if job.succeeded(i):
                done.setdefault(root, []).append((i, idn))
            else:
                aborted.setdefault(root, []).append(idn)
        for root in set(done) | set(aborted):
            try:
                self.stores[root].commit([idn for _, idn in done.get(root, [])],
                                         aborted.get(root, []))
            except OSError as exc:
                self._errors.record("commit", exc, self.stores[root].root)
                for i, _ in done.get(root, []):
                    job.fail(i, _store_failure(exc))

    def _probe_keys(self, keys: Sequence[BlockKey]) -> list[BlockKey]:
        """Probe thread: read the journals of the roots concerned, then look again."""
        routed = [(key, *self._route(key)) for key in keys]
        for root in {r for _, r, _ in routed}:
            try:
                self.stores[root].sync()
            except OSError as exc:
                self._errors.record("probe", exc, self.stores[root].root)
        return [key for key, root, idn in routed if self.stores[root].contains(idn)]


__all__ = ["FsTier"]
