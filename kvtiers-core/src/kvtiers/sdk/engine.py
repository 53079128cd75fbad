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

Threads: `submit_*`, `take_finished` and `closed` are for the scheduler thread and
never block (dictionary work and a queue append). Hooks and items run on the
engine's threads, never under its locks; an end hook also runs on the thread that
calls `close` (for jobs still queued) or `submit_*` (for a job refused after close).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvtiers.jobs import FailureReason, JobResult, TransferJob
from kvtiers.sdk.dualqueue import LOAD, STORE, DualQueueThreadPool, Kind
from kvtiers.sdk.job import CrashHook, EndHook, Job, JobFlow, JobLedger, Outcome, StartHook
from kvtiers.stats import StatsRecorder
from kvtiers.tier import TierContext

__all__ = ["BATCH_BYTES", "BatchFn", "BlockFn", "JobEngine", "JobHooks"]

#: items of one job are grouped into units of up to this many block bytes
BATCH_BYTES = 1 << 20

#: `block(job, i)`: do the I/O of key `i`; None when it succeeded
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


class JobEngine:
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
        name = name or f"kvtiers-{ctx.name or 'tier'}"
        self._hooks = {LOAD: load, STORE: store}
        self._clock = ctx.clock
        self._ledger = JobLedger(stats)
        self._flow = JobFlow(self._ledger, logger=ctx.logger,
                             block_bytes=ctx.block_bytes if block_bytes is None else block_bytes,
                             batch_bytes=batch_bytes, on_crash=on_crash, what=name)
        self.pool = DualQueueThreadPool(load_threads, store_threads, name=name,
                                        logger=ctx.logger)

    # Scheduler side: never blocks.

    @property
    def closed(self) -> bool:
        return self._ledger.closed

    @property
    def pending(self) -> int:
        """Jobs submitted and not reported yet."""
        return self._ledger.active

    def submit_load(self, job: TransferJob, state: Any = None) -> None:
        """Queue a load. `state` is the tier's (what it pinned at submit, say): it
        reaches every hook as `job.state`; the end hook runs even if the job never
        does, so whatever was taken at submit is always released."""
        self._submit(job, LOAD, state)

    def submit_store(self, job: TransferJob, state: Any = None) -> None:
        """Queue a store (see `submit_load`)."""
        self._submit(job, STORE, state)

    def take_finished(self) -> list[JobResult]:
        """Results of the jobs reported since the last call."""
        return self._ledger.take()

    # Any thread; these block.

    def drain(self, timeout: float | None = None) -> bool:
        """Wait (real time) until every submitted job is reported; False on timeout."""
        return self._ledger.drain(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new jobs, fail queued units with `closed`, wait for running ones
        (up to `timeout` per thread) and stop the threads. Idempotent. False when a
        thread was still in tier code after `timeout` (its job is reported when it
        returns)."""
        self._ledger.close()
        for task in self.pool.stop():  # reported now, not after the running ones
            task.cancel()
        self.pool.join(timeout)
        return not self.pool.alive()

    # The job's life.

    def _submit(self, transfer: TransferJob, kind: Kind, state: Any) -> None:
        job = Job(transfer, kind == LOAD, state, self._clock)
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

    def _queue(self, kind: Kind, tasks: Sequence[_Start | _Unit], first: bool) -> None:
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

