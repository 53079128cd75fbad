"""`JobEngine`: a tier's I/O threads and the job bookkeeping the contract asks of
every tier, done once.

A tier describes the work of a load and of a store as `JobHooks`; the engine runs
them on a `DualQueueThreadPool` and keeps the contract's promises:

- **per-block work items**: each key of a job is one item, `block(job, i)`; items of
  one job spread over every thread. Consecutive items of one job are grouped into
  units of up to `batch_bytes` (one item at least), run by `batch(job, indices)`
  when the tier gives one (one native call for many small blocks), else item by
  item.
- **hooks**: `start(job)` runs first, as a unit on the job's queue (a store's
  reservation); it settles the keys that need no I/O and returns the indices to
  run as items, which go to the *head* of the queue (a job that started finishes
  before jobs that did not). `end(job)` runs once after the last item and before
  the result is reported (commit, unpin), for every job, including jobs that
  never ran (timeout, closed).
- **exactly once**: a job is reported once every unit of it has returned, so no
  I/O of the tier can still touch its slots.
- **deadlines**, on the tier's clock: a unit taken after the job's deadline fails
  its keys with `timeout` without calling tier code.
- **closed**: units still queued at `close`, and jobs submitted after it, fail with
  `closed`.
- **crashes**: an exception in tier code fails the keys concerned with `io`, is
  logged (and passed to `on_crash`); the thread lives on.
- **loads ahead of stores**: load threads take loads first, store threads stores
  first, idle threads of one kind take the other's work.
- **deferred keys**: an item that must wait for something else (another writer's
  copy of its block) returns `job.defer(i)` instead of sleeping on its thread; any
  thread settles the handle later, or `resume`s it to run the item again at the
  head of the queue (`kvtiers.sdk.job.Deferred`). The job's deadline and `close`
  settle it first if they come first (`kvtiers.sdk.deferred`). When a deferred
  key is the job's last unit, its end hook runs on an engine thread (queued at the
  head), not on the thread that settled it.

Threads: `submit_*`, `take_finished` and `closed` are for the scheduler thread and
never block (dictionary work and a queue append). Hooks and items run on the
engine's threads, never under its locks; an end hook also runs on the thread that
calls `close` (for jobs still queued) or `submit_*` (for a job refused after close),
and on the thread that settles a deferred key after the pool has stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvtiers.contract.jobs import FailureReason, TransferJob
from kvtiers.contract.stats import StatsRecorder
from kvtiers.contract.tier import TierContext
from kvtiers.sdk.deferred import Deferrals
from kvtiers.sdk.dualqueue import LOAD, STORE, DualQueueThreadPool, Kind
from kvtiers.sdk.engine_front import EngineFront
from kvtiers.sdk.job import CrashHook, EndHook, Job, Outcome, StartHook

__all__ = ["BATCH_BYTES", "BatchFn", "BlockFn", "JobEngine", "JobHooks"]

#: items of one job are grouped into units of up to this many block bytes
BATCH_BYTES = 1 << 20

#: `block(job, i)`: do the I/O of key `i`; None when it succeeded, or `job.defer(i)`
BlockFn = Callable[[Job, int], Outcome]
#: `batch(job, indices)`: the I/O of several consecutive keys; one outcome per index
BatchFn = Callable[[Job, Sequence[int]], Sequence[Outcome]]


@dataclass(frozen=True, slots=True)
class JobHooks:
    """What a tier does for one kind of job (load or store).

    - `block(job, i) -> None | FailureReason`: the I/O of key `i` (read the slot
      `job.slots[i]` for a store, fill it for a load). Required.
    - `batch(job, indices) -> [None | FailureReason]`: optional; the I/O of a unit of
      several consecutive keys at once (used whenever units hold several items).
    - `start(job) -> indices`: optional; runs first, on an engine thread. Settles
      with `job.succeed(i)` / `job.fail(i, reason)` the keys that need no I/O and
      returns the indices still to run, each once. May set `job.state`.
    - `end(job)`: optional; runs once after the last item, before the result is
      reported; may `job.fail` keys that succeeded (a commit that failed).

    A success moves `block_bytes` bytes (the engine's; a start hook's `succeed`
    says its own). Exceptions cost `io` for the keys concerned, never the engine.
    """

    block: BlockFn
    batch: BatchFn | None = None
    start: StartHook | None = None
    end: EndHook | None = None


class JobEngine(EngineFront[JobHooks]):
    """Runs one tier's jobs on `load_threads` + `store_threads` threads (either may
    be 0, not both). `stats` records every result reported; `block_bytes` (default
    the context's) is what one successful item moved; `on_crash` is told of every
    exception tier code raised (counted in the tier's own error stats, say)."""

    def __init__(
        self,
        ctx: TierContext,
        *,
        load: JobHooks,
        store: JobHooks,
        load_threads: int = 1,
        store_threads: int = 1,
        stats: StatsRecorder | None = None,
        batch_bytes: int = BATCH_BYTES,
        block_bytes: int | None = None,
        on_crash: CrashHook | None = None,
        name: str | None = None,
    ):
        super().__init__(ctx, load=load, store=store, stats=stats, batch_bytes=batch_bytes,
                         block_bytes=block_bytes, on_crash=on_crash, name=name)
        self.pool = DualQueueThreadPool(load_threads, store_threads, name=self._name,
                                        logger=ctx.logger)
        self._deferrals = Deferrals(ctx.clock, settle=self._settle_deferred,
                                    resume=self._resume_deferred, name=self._name)

    # Scheduler side: never blocks (and `EngineFront`'s calls).

    @property
    def deferred(self) -> int:
        """Keys deferred (`Job.defer`) and not settled yet."""
        return len(self._deferrals)

    # Any thread; blocks.

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new jobs, fail queued units and deferred keys with `closed`, wait
        for running ones (up to `timeout` per thread) and stop the threads.
        Idempotent. False when a thread was still in tier code after `timeout` (its
        job is reported when it returns)."""
        self._ledger.close()
        self._deferrals.close()
        for task in self.pool.stop():  # reported now, not after the running ones
            task.cancel()
        self.pool.join(timeout)
        return not self.pool.alive()

    # The job's life.

    def _submit(self, transfer: TransferJob, kind: Kind, state: Any) -> None:
        job = Job(transfer, kind == LOAD, state, self._clock)
        job._deferrer = self._deferrals
        hooks = self._hooks[kind]
        if not self._ledger.admit():
            job._settle_rest(FailureReason.CLOSED)
            self._flow.end(job, hooks.end, counted=False)
            return
        if not transfer.keys:
            self._flow.end(job, hooks.end)
        elif hooks.start is not None:
            job._add_units(1)
            self._queue(kind, [_Start(self, job, kind)], first=False)
        else:
            self._queue_items(job, kind, range(len(transfer.keys)), first=False)

    def _queue(self, kind: Kind, tasks: Sequence[_Start | _Unit | _End], first: bool) -> None:
        if not self.pool.submit(kind, tasks, first=first):
            for task in tasks:
                task.cancel()

    def _queue_items(self, job: Job, kind: Kind, indices: Sequence[int], first: bool) -> None:
        units = self._flow.units(indices)
        job._add_units(len(units))  # before any of them can run and retire
        self._queue(kind, [_Unit(self, job, kind, u) for u in units], first)

    def _run_start(self, job: Job, kind: Kind) -> None:
        job._begin()
        hooks = self._hooks[kind]
        assert hooks.start is not None
        if job.expired():
            job._settle_rest(FailureReason.TIMEOUT)
        else:
            items = self._flow.start(job, hooks.start)
            if items:
                self._queue_items(job, kind, items, first=True)
        self._retire(job, kind, (), (), 1)

    def _run_unit(self, job: Job, kind: Kind, indices: Sequence[int]) -> None:
        job._begin()
        hooks = self._hooks[kind]
        outcomes: Sequence[Outcome]
        if job.expired():
            outcomes = [FailureReason.TIMEOUT] * len(indices)
        elif hooks.batch is not None and self._flow.per_unit > 1:
            outcomes = self._batch(job, hooks.batch, indices)
        else:
            outcomes = [self._block(job, hooks.block, i) for i in indices]
        self._retire(job, kind, indices, outcomes, 1)

    def _block(self, job: Job, block: BlockFn, i: int) -> Outcome:
        if job.expired():  # taken now, after the deadline: no I/O
            return FailureReason.TIMEOUT
        try:
            return block(job, i)
        except Exception as exc:  # noqa: BLE001 - a tier bug costs misses, not the engine
            self._flow.crashed(job, f"the work item of key {i}", exc)
            return FailureReason.IO

    def _batch(self, job: Job, batch: BatchFn, indices: Sequence[int]) -> Sequence[Outcome]:
        try:
            outcomes = list(batch(job, indices))
        except Exception as exc:  # noqa: BLE001 - a tier bug costs misses, not the engine
            self._flow.crashed(job, f"a batch of {len(indices)} items", exc)
            return [FailureReason.IO] * len(indices)
        if len(outcomes) != len(indices):
            self._flow.crashed(job, "a batch", ValueError(
                f"batch returned {len(outcomes)} outcomes for {len(indices)} items"))
            return [FailureReason.IO] * len(indices)
        return outcomes

    def _retire(self, job: Job, kind: Kind, indices: Sequence[int],
                outcomes: Sequence[Outcome], units: int) -> None:
        if job._settle(indices, outcomes, self._flow.block_bytes, units):
            self._flow.end(job, self._hooks[kind].end)

    def _settle_deferred(self, job: Job, i: int, outcome: FailureReason | None,
                         moved: int | None) -> None:
        """A deferred key's outcome (any thread): its unit retires; the end of the job,
        when it was the last, is handed to an engine thread."""
        kind = LOAD if job.load else STORE
        moved = self._flow.block_bytes if moved is None else moved
        if job._settle((i,), (outcome,), moved, 1):
            self._queue(kind, [_End(self, job, kind)], first=True)

    def _resume_deferred(self, job: Job, i: int) -> None:
        """Run a deferred key's item again: the deferral's unit becomes this one."""
        kind = LOAD if job.load else STORE
        self._queue(kind, [_Unit(self, job, kind, (i,))], first=True)

    def _cancel(self, job: Job, kind: Kind, indices: Sequence[int] | None) -> None:
        """A unit the pool will never run (closed)."""
        if indices is None:  # the start hook: no key can be settled by it any more
            job._settle_rest(FailureReason.CLOSED)
            self._retire(job, kind, (), (), 1)
        else:
            self._retire(job, kind, indices, [FailureReason.CLOSED] * len(indices), 1)


class _Start:
    """A job's start hook, as a pool task."""

    __slots__ = ("engine", "job", "kind")

    def __init__(self, engine: JobEngine, job: Job, kind: Kind):
        self.engine, self.job, self.kind = engine, job, kind

    def run(self) -> None:
        self.engine._run_start(self.job, self.kind)

    def cancel(self) -> None:
        self.engine._cancel(self.job, self.kind, None)


class _Unit:
    """Consecutive work items of one job, as a pool task."""

    __slots__ = ("engine", "job", "kind", "indices")

    def __init__(self, engine: JobEngine, job: Job, kind: Kind, indices: Sequence[int]):
        self.engine, self.job, self.kind, self.indices = engine, job, kind, indices

    def run(self) -> None:
        self.engine._run_unit(self.job, self.kind, self.indices)

    def cancel(self) -> None:
        self.engine._cancel(self.job, self.kind, self.indices)



class _End:
    """The end of a job whose last unit was a deferred key, as a pool task: the end
    hook runs on an engine thread (or, once the pool stopped, where it is cancelled)."""

    __slots__ = ("engine", "job", "kind")

    def __init__(self, engine: JobEngine, job: Job, kind: Kind):
        self.engine, self.job, self.kind = engine, job, kind

    def run(self) -> None:
        self.engine._flow.end(self.job, self.engine._hooks[self.kind].end)

    def cancel(self) -> None:
        self.run()
