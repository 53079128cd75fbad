"""`FsTier` (`{"type": "fs"}`): blocks as files under one or several root
directories - persistent, shared by every process that opens the same roots,
verified, crash-safe, bounded per root.

Threads and what they may do:

- the scheduler thread calls `lookup`, `submit_*`, `touch`, `get_finished_jobs`,
  `stats`: dictionary work only (the in-memory index of each root), never I/O;
- I/O threads (a `DualQueueThreadPool`) run one task per block (per 1 MiB of
  consecutive blocks of a job, for blocks smaller than that) - `pwritev`/`preadv`
  straight from/to the pool slot, checksums included - plus one task per store job
  that reserves room in the shared journal; a store job's block tasks go to the
  head of the store queue, so that its writes start while later jobs reserve;
- the probe thread (`AsyncProbe`) answers lookups of keys this process has not seen
  yet: it reads what other processes appended to the journal, then looks again.

A job is reported once every task of it has returned, so no I/O of this tier can
touch its slots afterwards. A task taken after its job's deadline fails with
`timeout` without any I/O. Failures are per key, counted, logged once per kind; an
exception never leaves the tier.

Layout: `kvtiers_fs.layout`; index, capacity and crash recovery:
`kvtiers_fs.store`.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from kvtiers.errors import ConfigError, ConfigProblem
from kvtiers.inventory import TierInventory
from kvtiers.jobs import FailureReason, JobResult, TransferJob
from kvtiers.keys import BlockKey
from kvtiers.lookup import LookupResult
from kvtiers.options import resolve_options
from kvtiers.probe import AsyncProbe
from kvtiers.stats import StatsRecorder, TierStats
from kvtiers.tier import SecondaryTier, TierContext

from kvtiers_fs import layout
from kvtiers_fs.blockio import BlockIO, ReadOutcome, ReadResult, probe_o_direct
from kvtiers_fs.dualqueue import LOAD, STORE, DualQueueThreadPool
from kvtiers_fs.errorlog import ErrorLog
from kvtiers_fs.layout import Ident
from kvtiers_fs.namespaces import list_namespaces
from kvtiers_fs.schema import FS_SCHEMA, check_options, root_dirs
from kvtiers_fs.store import RootStore, Verdict

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


_WAIT_FAILURES = {Verdict.FULL: FailureReason.FULL, Verdict.TIMEOUT: FailureReason.TIMEOUT,
                  Verdict.CLOSED: FailureReason.CLOSED}


def _store_failure(exc: OSError) -> FailureReason:
    return FailureReason.FULL if exc.errno in _FULL_ERRNOS else FailureReason.IO


class _JobState:
    """One job in flight: per-key outcomes filled in by its tasks."""

    __slots__ = ("job", "load", "lock", "left", "ok", "failed", "moved", "started",
                 "done", "aborted")

    def __init__(self, job: TransferJob, load: bool):
        self.job = job
        self.load = load
        self.lock = threading.Lock()
        self.left = 0
        self.ok: list[BlockKey] = []
        self.failed: dict[BlockKey, FailureReason] = {}
        self.moved = 0
        self.started = 0.0
        # stores: per root index, (job index, key, ident) written / reserved idents
        # not written
        self.done: dict[int, list[tuple[int, BlockKey, Ident]]] = {}
        self.aborted: dict[int, list[Ident]] = {}

    def start(self) -> None:
        if not self.started:
            self.started = time.perf_counter()

    def expired(self, clock_now: float) -> bool:
        return self.job.deadline is not None and clock_now > self.job.deadline


class _Task:
    """One unit of work on an I/O thread: a block, or a store job's reservation."""

    __slots__ = ("tier", "state", "index", "root", "idn", "recycled", "done", "own")

    def __init__(self, tier: FsTier, state: _JobState, index: int = -1, root: int = -1,
                 idn: Ident = b"", recycled: bool = False, own: bool = True):
        self.tier, self.state, self.index, self.root, self.idn = tier, state, index, root, idn
        self.recycled = recycled  # a store into an evicted block's file
        self.done = False  # reported through _block_done
        # a store that holds its own intent (False: waiting for another writer's)
        self.own = own

    def run(self) -> None:
        tier = self.tier
        try:
            if self.index < 0:
                tier._prepare_store(self.state)
                return
            if self.state.load:
                tier._load_block(self)
            else:
                tier._store_block(self)
        except Exception as exc:  # noqa: BLE001 - a bug costs misses, not the engine
            tier.ctx.logger.exception("kvtiers-fs task of job %d crashed", self.state.job.job_id)
            tier._errors.record("task", exc)
            if self.index < 0:
                tier._finish(self.state, {k: FailureReason.IO for k in self.state.job.keys})
            else:
                tier._block_done(self, FailureReason.IO)

    def cancel(self) -> None:
        """Never run: the tier closed."""
        if self.index < 0:
            self.tier._finish(self.state, {k: FailureReason.CLOSED for k in self.state.job.keys})
        else:
            self.tier._block_done(self, FailureReason.CLOSED)


class _Batch:
    """Consecutive block tasks of one job run as one pool task: for small blocks the
    pool's per-task cost (queue, wake-up, counters) would outweigh the I/O."""

    __slots__ = ("tasks",)

    def __init__(self, tasks: list[_Task]):
        self.tasks = tasks

    def run(self) -> None:
        first = self.tasks[0]
        if first.state.load:
            try:
                first.tier._load_batch(self.tasks)
            except Exception as exc:  # noqa: BLE001 - a bug costs misses, not the engine
                first.tier.ctx.logger.exception("kvtiers-fs load batch crashed")
                first.tier._errors.record("task", exc)
                for task in self.tasks:
                    if not task.done:
                        first.tier._block_done(task, FailureReason.IO)
            return
        for task in self.tasks:
            task.run()

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


#: block tasks are batched up to this many bytes per pool task (one block at least)
BATCH_BYTES = 1 << 20


def _batched(tasks: list[_Task], block_bytes: int) -> list[_Task] | list[_Batch]:
    per = BATCH_BYTES // block_bytes
    if per <= 1:
        return tasks
    return [_Batch(tasks[i : i + per]) for i in range(0, len(tasks), per)]


class FsTier(SecondaryTier):
    """See the module doc; config: `kvtiers_fs.schema.FS_SCHEMA`."""

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
        self._errors = ErrorLog(ctx.logger, name)
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
        self._lock = threading.Condition()
        self._finished: list[JobResult] = []
        self._active = 0
        self._closed = False
        self._pool = DualQueueThreadPool(threads["load"], threads["store"],
                                         name=f"kvtiers-{name}", logger=ctx.logger)
        # Capability flag, per instance: a private root needs no probes.
        self.shared = bool(config.get("shared", True))
        self._probe = AsyncProbe(self._probe_keys, clock=ctx.clock, hit_ttl_s=0.0,
                                 miss_ttl_s=1.0, name=f"kvtiers-{name}-probe")
        self._log_neighbours()

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
        if self.stores[root].contains(idn):
            self._stats.lookup(True)
            return LookupResult.HIT
        if not self.shared:
            self._stats.lookup(False)
            return LookupResult.MISS
        # Maybe another process stored it since we last read the journal.
        answer = self._probe.check(key)
        if answer is not LookupResult.RETRY:
            self._stats.lookup(answer is LookupResult.HIT)
        return answer

    def submit_store(self, job: TransferJob) -> None:
        state = _JobState(job, load=False)
        if not job.keys or self._closed:
            self._finish(state, {k: FailureReason.CLOSED for k in job.keys}, counted=False)
            return
        self._begin()
        task = _Task(self, state)
        if not self._pool.submit(STORE, [task]):
            task.cancel()

    def submit_load(self, job: TransferJob) -> None:
        state = _JobState(job, load=True)
        if not job.keys or self._closed:
            self._finish(state, {k: FailureReason.CLOSED for k in job.keys}, counted=False)
            return
        self._begin()
        tasks = []
        by_root: dict[int, list[Ident]] = {}
        for i, key in enumerate(job.keys):
            root, idn = self._route(key)
            by_root.setdefault(root, []).append(idn)
            tasks.append(_Task(self, state, i, root, idn))
        for root, idns in by_root.items():  # what lookup called a HIT stays until loaded
            self.stores[root].pin(idns)
        state.left = len(tasks)
        if not self._pool.submit(LOAD, _batched(tasks, self.block_bytes)):
            for task in tasks:
                task.cancel()

    def get_finished_jobs(self) -> list[JobResult]:
        with self._lock:
            done, self._finished = self._finished, []
        return done

    def drain(self, timeout: float | None = None) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self._active == 0, timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._pool.close():
            task.cancel()
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

    def block_path(self, key: BlockKey) -> str:
        """Where the file of `key` is (tests, tools)."""
        root, idn = self._route(key)
        return "/".join([self.roots[root], self.namespace, "blocks",
                         layout.block_relpath(idn)])

    @property
    def o_direct(self) -> list[bool]:
        return [io.o_direct for io in self._io]

    # -- I/O threads ---------------------------------------------------------------

    def _begin(self) -> None:
        with self._lock:
            self._active += 1

    def _finish(self, state: _JobState, failed: Mapping[BlockKey, FailureReason],
                counted: bool = True) -> None:
        job = state.job
        result = JobResult(job.job_id, list(state.ok), {**state.failed, **failed},
                           state.moved,
                           time.perf_counter() - state.started if state.started else 0.0)
        result.ok = [k for k in result.ok if k not in result.failed]
        self._stats.job(result, load=state.load)
        with self._lock:
            self._finished.append(result)
            if counted:
                self._active -= 1
            self._lock.notify_all()

    def _prepare_store(self, state: _JobState) -> None:
        """Reserve room for a store job (one journal frame per root), then queue one
        task per block to write."""
        job = state.job
        state.start()
        if state.expired(self.ctx.clock()):
            self._finish(state, {k: FailureReason.TIMEOUT for k in job.keys})
            return
        by_root: dict[int, list[tuple[int, Ident]]] = {}
        for i, key in enumerate(job.keys):
            root, idn = self._route(key)
            by_root.setdefault(root, []).append((i, idn))
        tasks: list[_Task] = []
        waiting: list[_Task] = []
        for root, items in by_root.items():
            store = self.stores[root]
            try:
                verdicts, evicted = store.reserve([(idn, self.file_bytes) for _, idn in items])
            except OSError as exc:
                self._errors.record("reserve", exc, store.root)
                for i, _ in items:
                    state.failed[job.keys[i]] = _store_failure(exc)
                continue
            if evicted:
                self._stats.evicted(evicted)
            for (i, idn), verdict in zip(items, verdicts, strict=True):
                if verdict is Verdict.PRESENT:
                    state.ok.append(job.keys[i])
                elif verdict is Verdict.FULL:
                    state.failed[job.keys[i]] = FailureReason.FULL
                elif verdict is Verdict.PENDING:  # another intent is writing it: wait
                    waiting.append(_Task(self, state, i, root, idn, own=False))
                else:
                    tasks.append(_Task(self, state, i, root, idn,
                                       recycled=verdict is Verdict.RECYCLED))
        if not tasks and not waiting:
            self._finish(state, {})
            return
        state.left = len(tasks) + len(waiting)
        # At the head of the queue: with many store jobs queued, the reservations
        # (one at a time, under the namespace lock) would otherwise all run before
        # any block is written, leaving the disk idle meanwhile.
        if tasks and not self._pool.submit(STORE, _batched(tasks, self.block_bytes), first=True):
            for task in tasks:
                task.cancel()
        for task in waiting:
            self.stores[task.root].await_intent(task.idn, self.file_bytes, job.deadline,
                                                self.ctx.clock, partial(self._intent_ended, task))

    def _intent_ended(self, task: _Task, verdict: Verdict) -> None:
        """The other intent on a block this job waited for ended (`RootStore.
        await_intent`): stored by it, failed, or reserved for us to write now."""
        if verdict is Verdict.PRESENT:
            self._block_done(task, None)
        elif verdict in (Verdict.GRANTED, Verdict.RECYCLED):
            task.own, task.recycled = True, verdict is Verdict.RECYCLED
            if not self._pool.submit(STORE, [task], first=True):
                task.cancel()
        else:
            self._block_done(task, _WAIT_FAILURES.get(verdict, FailureReason.IO))

    def _store_block(self, task: _Task) -> None:
        state, job = task.state, task.state.job
        if state.expired(self.ctx.clock()):
            self._block_done(task, FailureReason.TIMEOUT)
            return
        store, key = self.stores[task.root], job.keys[task.index]
        try:
            shard = store.shard_fd(task.idn, create=True)
            try:
                self._io[task.root].write(shard, task.idn, key, store.writer,
                                          self.ctx.pool.block(job.slots[task.index]),
                                          recycled=task.recycled)
            finally:
                layout.close_quiet(shard)
        except OSError as exc:
            self._errors.record("store", exc, store.root)
            self._block_done(task, _store_failure(exc))
            return
        self._block_done(task, None)

    def _load_block(self, task: _Task) -> None:
        state, job = task.state, task.state.job
        state.start()
        if state.expired(self.ctx.clock()):
            self._block_done(task, FailureReason.TIMEOUT)
            return
        store, key = self.stores[task.root], job.keys[task.index]
        io, slot = self._io[task.root], self.ctx.pool.block(job.slots[task.index])
        try:
            # One openat2 of <shard>/<file> where the kernel has it; the two-step
            # open (shard directory, then file) otherwise, and to classify errors.
            got = io.read_beneath(store.blocks_fd, task.idn, key, slot)
        except OSError as exc:
            self._load_failed(task, exc)
            return
        if got is None:
            try:
                shard = store.shard_fd(task.idn, create=False)
            except FileNotFoundError:
                self._missing(store, task.idn)
                self._block_done(task, FailureReason.MISSING)
                return
            except OSError as exc:
                self._load_failed(task, exc)
                return
            try:
                got = io.read(shard, task.idn, key, slot)
            except OSError as exc:
                self._load_failed(task, exc)
                return
            finally:
                layout.close_quiet(shard)
        self._after_read(task, got)

    def _load_failed(self, task: _Task, exc: OSError) -> None:
        store = self.stores[task.root]
        self._errors.record("load", exc, store.root)
        store.unreadable(task.idn, exc)  # not a HIT for ever
        self._block_done(task, FailureReason.IO)

    def _load_batch(self, tasks: list[_Task]) -> None:
        """Loads of consecutive small blocks of one job: one native call reads them
        all (`BlockIO.read_many`); a block it does not settle takes `_load_block`."""
        state, job = tasks[0].state, tasks[0].state.job
        state.start()
        live = []
        for task in tasks:
            if state.expired(self.ctx.clock()):
                self._block_done(task, FailureReason.TIMEOUT)
            else:
                live.append(task)
        by_root: dict[int, list[_Task]] = {}
        for task in live:
            by_root.setdefault(task.root, []).append(task)
        for root, group in by_root.items():
            items = [(t.idn, job.keys[t.index], self.ctx.pool.block(job.slots[t.index]))
                     for t in group]
            try:
                results = self._io[root].read_many(self.stores[root].blocks_fd, items)
            except OSError:
                results = [None] * len(group)
            for task, got in zip(group, results, strict=True):
                if got is None:
                    self._load_block(task)
                else:
                    self._after_read(task, got)

    def _after_read(self, task: _Task, got: ReadResult) -> None:
        store, key = self.stores[task.root], task.state.job.keys[task.index]
        if got.outcome is ReadOutcome.OK:
            self._block_done(task, None)
        elif got.outcome is ReadOutcome.MISSING:
            self._missing(store, task.idn)
            self._block_done(task, FailureReason.MISSING)
        elif got.outcome is ReadOutcome.FOREIGN:
            # Intact, but another version's or namespace's: never data, never deleted.
            self._errors.note("load", "foreign", f"{self.block_path(key)}: {got.why}")
            self._drop(store, task.idn, delete_file=False)
            self._block_done(task, FailureReason.MISSING)
        else:
            self._errors.note("load", "corrupt", f"{self.block_path(key)}: {got.why}; removed")
            self._drop(store, task.idn, delete_file=True)
            self._block_done(task, FailureReason.CORRUPT)

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
            self._drop(store, idn, delete_file=False)

    def _drop(self, store: RootStore, idn: Ident, *, delete_file: bool) -> None:
        try:
            store.remove(idn, delete_file=delete_file)
        except OSError as exc:
            self._errors.record("remove", exc, store.root)

    def _block_done(self, task: _Task, reason: FailureReason | None) -> None:
        task.done = True
        state = task.state
        key = state.job.keys[task.index]
        with state.lock:
            if reason is None:
                state.ok.append(key)
                if task.own:  # (else another writer's copy: nothing moved, ours to end)
                    state.moved += self.block_bytes
                    if not state.load:
                        state.done.setdefault(task.root, []).append((task.index, key, task.idn))
            else:
                state.failed[key] = reason
                if not state.load and task.own:
                    state.aborted.setdefault(task.root, []).append(task.idn)
            state.left -= 1
            last = state.left == 0
        if last:
            self._end_job(state)

    def _end_job(self, state: _JobState) -> None:
        """The last task of a job: commit or abort a store's intents; unpin and touch
        a load's keys. Then report."""
        job = state.job
        if state.load:
            by_root: dict[int, list[Ident]] = {}
            ok = set(state.ok)
            touched: dict[int, list[Ident]] = {}
            for key in job.keys:
                root, idn = self._route(key)
                by_root.setdefault(root, []).append(idn)
                if key in ok:
                    touched.setdefault(root, []).append(idn)
            for root, idns in by_root.items():
                self.stores[root].unpin(idns)
            for root, idns in touched.items():
                self.stores[root].touch(idns)
                try:
                    self.stores[root].flush_touches()
                except OSError as exc:
                    self._errors.record("touch", exc)
            self._finish(state, {})
            return
        extra: dict[BlockKey, FailureReason] = {}
        for root in set(state.done) | set(state.aborted):
            # In the job's order, not the threads': a prefix's first blocks are older.
            done = sorted(state.done.get(root, []))
            try:
                self.stores[root].commit([i for _, _, i in done], state.aborted.get(root, []))
            except OSError as exc:
                self._errors.record("commit", exc, self.stores[root].root)
                for _, key, _ in done:
                    extra[key] = _store_failure(exc)
        if extra:
            state.moved -= len(extra) * self.block_bytes
        self._finish(state, extra)

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
