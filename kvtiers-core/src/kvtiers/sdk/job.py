"""What the job engines share: the `Job` handle that tier code is given, and the
`JobLedger` that reports every job exactly once.

A job's keys are settled one by one, each exactly one way: succeeded (with the
bytes it moved) or failed with a `FailureReason`. Work items settle their keys by
returning; a start hook settles the keys it does no I/O for (`succeed`, `fail`);
an end hook may still fail a key that succeeded (a commit that did not happen).
A key nobody settled is a tier bug: it fails with `io`, and the engine logs it.

A work item that must wait for something outside the tier's I/O (another writer's
copy of the same block, say) does not sleep on its thread: it returns
`job.defer(i)`, a `Deferred` that any thread settles later (`succeed`, `fail`) or
hands back to the engine to run the item again (`resume`). Exactly once still
holds: the first of those calls, the job's deadline and `close` wins; the job is
reported only once the deferred key is settled. Engines that support it:
`JobEngine` (an `AsyncJobEngine` item awaits instead).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from kvtiers.contract.clock import Clock
from kvtiers.contract.jobs import FailureReason, JobResult, TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.stats import StatsRecorder

__all__ = ["CrashHook", "Deferred", "EndHook", "Job", "JobFlow", "JobLedger", "Outcome",
           "StartHook"]


def _reason(value: object) -> FailureReason:
    try:
        return FailureReason(value)
    except ValueError:
        return FailureReason.IO


class Deferred:
    """The outcome of key `index` of `job`, settled later (`Job.defer`). Thread-safe:
    any thread may call `succeed`, `fail` or `resume`; the first call, the job's
    deadline (the engine fails the key with `timeout` once it passes) or the
    engine's `close` (`closed`) settles it, and every later call returns False and
    does nothing. So whoever holds a handle checks the result: a False `resume`
    means no item will run, and what the tier took for it (a reservation) is to be
    given back by the tier.

    While deferred, the tier does no I/O on the key's slot: the engine may report
    the job as soon as the key is settled (by its deadline, say), and then nothing
    of the tier may touch the job's slots. I/O that the wait ends in is done by the
    item run again (`resume`), on an engine thread, under the usual rules.

    A job without a deadline waits as long as its deferred keys do: the tier bounds
    the wait itself."""

    __slots__ = ("job", "index", "_engine", "_done")

    def __init__(self, job: Job, index: int, engine: Deferrer):
        self.job = job
        self.index = index
        self._engine = engine
        self._done = False

    @property
    def done(self) -> bool:
        """Settled or resumed already (by anyone, the deadline or close included)."""
        return self._done

    def succeed(self, moved: int | None = None) -> bool:
        """The key succeeded, having moved `moved` bytes (default: the engine's block
        bytes; 0 when nothing was copied, say another writer's copy is the block).
        False when it was settled already."""
        return self._engine.settle_deferred(self, None, moved)

    def fail(self, reason: FailureReason) -> bool:
        """The key failed with `reason`. False when it was settled already."""
        return self._engine.settle_deferred(self, FailureReason(reason), None)

    def resume(self) -> bool:
        """Run the key's work item again, from the head of the job's queue, on an
        engine thread (deadline and close apply as to any item); `job.state` says
        what it is to do now. False when it was settled already (nothing runs)."""
        return self._engine.resume_deferred(self)

    def _claim(self) -> bool:
        """Engine side, under the engine's deferral lock: take the right to settle."""
        if self._done:
            return False
        self._done = True
        return True


#: what a work item returns for one key: None (it succeeded), why it failed, or the
#: `Deferred` of `job.defer(i)` (anything else is a tier bug and counts as `io`)
Outcome = FailureReason | Deferred | None


class Deferrer(Protocol):
    """What an engine that supports `Job.defer` provides (engine-internal)."""

    def defer(self, job: Job, i: int) -> Deferred: ...

    def settle_deferred(self, d: Deferred, outcome: FailureReason | None,
                        moved: int | None) -> bool: ...

    def resume_deferred(self, d: Deferred) -> bool: ...


class Job:
    """One submitted job inside an engine. Tier code reads `transfer`, `load` and
    `state` (whatever the tier passed at submit, or set in its start hook), and
    settles keys by index into `transfer.keys`.

    Items of one job may run on several threads at once: each settles only its own
    indices, so the only shared counter is guarded by the job's lock."""

    __slots__ = ("transfer", "load", "state", "started", "_clock", "_out", "_left", "_lock",
                 "_deferrer")

    def __init__(self, transfer: TransferJob, load: bool, state: Any, clock: Clock):
        self.transfer = transfer
        self.load = load
        self.state = state
        #: perf_counter when the engine first took work of this job (0.0: never)
        self.started = 0.0
        self._clock = clock
        # Per key: None (unsettled), an int (succeeded; bytes moved) or a FailureReason.
        self._out: list[int | FailureReason | None] = [None] * len(transfer.keys)
        self._left = 0  # queued or running work units (items, or the start hook)
        self._lock = threading.Lock()
        self._deferrer: Deferrer | None = None  # set by an engine that supports `defer`

    @property
    def job_id(self) -> int:
        return self.transfer.job_id

    @property
    def keys(self) -> Sequence[BlockKey]:
        return self.transfer.keys

    @property
    def slots(self) -> Sequence[int]:
        return self.transfer.slots

    def expired(self) -> bool:
        """The job's deadline (on the tier's clock) has passed."""
        deadline = self.transfer.deadline
        return deadline is not None and self._clock() > deadline

    def succeed(self, i: int, moved: int = 0) -> None:
        """Key `i` succeeded, having moved `moved` bytes (0: nothing to copy, such
        as a store of a key already held). For start and end hooks."""
        self._out[i] = moved

    def fail(self, i: int, reason: FailureReason) -> None:
        """Key `i` failed with `reason`; replaces a success (its bytes no longer
        count). For start and end hooks."""
        self._out[i] = FailureReason(reason)

    def succeeded(self, i: int) -> bool:
        """Whether key `i` has succeeded (so far: an end hook may still fail it)."""
        out = self._out[i]
        return out is not None and not isinstance(out, FailureReason)

    def settled(self, i: int) -> bool:
        return self._out[i] is not None

    def succeeded_keys(self) -> list[BlockKey]:
        """The keys that have succeeded (so far), in the job's order: `keys[i]` for
        each `i` with `succeeded(i)`, without a call per key (an end hook touching
        what a load of thousands of blocks read)."""
        return [key for key, out in zip(self.transfer.keys, self._out, strict=True)
                if out is not None and out.__class__ is not FailureReason]

    def defer(self, i: int) -> Deferred:
        """For a work item of key `i` that must wait for something else (see
        `Deferred`): the item returns this handle at once, and the key is settled
        when the handle is (or by the deadline, or close). Raises RuntimeError on an
        engine without deferral."""
        if self._deferrer is None:
            raise RuntimeError("this engine cannot defer a key (JobEngine can; an "
                               "AsyncJobEngine item awaits instead)")
        return self._deferrer.defer(self, i)

    # Engine side.

    def _begin(self) -> None:
        if not self.started:
            self.started = time.perf_counter()

    def _add_units(self, n: int) -> None:
        with self._lock:
            self._left += n

    def _settle(self, indices: Sequence[int], outcomes: Sequence[Outcome], moved: int,
                units: int) -> bool:
        """Record item outcomes (None: succeeded, `moved` bytes; a `Deferred`: later)
        and retire `units` work units. True for the call that retired the job's last
        unit."""
        out = self._out
        n = len(outcomes)
        if n != len(indices):
            raise ValueError(f"{n} outcomes for {len(indices)} items")
        if outcomes.count(None) == n:  # every item moved: the common case, at C speed
            if isinstance(indices, range) and indices.step == 1:
                out[indices.start:indices.stop] = [moved] * n
            else:
                for i in indices:
                    out[i] = moved
        else:
            for i, outcome in zip(indices, outcomes, strict=True):
                if outcome is None:
                    out[i] = moved
                elif not isinstance(outcome, Deferred):  # a deferred key is its handle's
                    out[i] = _reason(outcome)
        with self._lock:
            self._left -= units
            return self._left == 0

    def _settle_rest(self, reason: FailureReason) -> None:
        """Fail every key not settled yet (timeout, closed, a crashed start hook)."""
        out = self._out
        for i, o in enumerate(out):
            if o is None:
                out[i] = reason

    def _fail_successes(self, reason: FailureReason) -> None:
        """Fail every key that succeeded (a crashed end hook: nothing it vouched for
        may be reported as done)."""
        out = self._out
        for i, o in enumerate(out):
            if o is not None and not isinstance(o, FailureReason):
                out[i] = reason

    def _result(self, log: logging.Logger) -> JobResult:
        result = JobResult(self.transfer.job_id)
        result.seconds = time.perf_counter() - self.started if self.started else 0.0
        try:  # only ints add up: every key succeeded (the common case, at C speed)
            result.bytes_moved = sum(self._out)  # type: ignore[arg-type]
        except TypeError:  # a failure (a str enum) or an unsettled key (None)
            pass
        else:
            result.ok.extend(self.transfer.keys)
            return result
        ok, failed = result.ok, result.failed
        moved = unsettled = 0
        for key, o in zip(self.transfer.keys, self._out, strict=True):
            if o is None:
                failed[key] = FailureReason.IO
                unsettled += 1
            elif isinstance(o, FailureReason):
                failed[key] = o
            else:
                ok.append(key)
                moved += o
        if unsettled:
            log.error("job %d: the tier settled %d key(s) of %d neither way; they fail "
                      "with io", self.transfer.job_id, unsettled, len(self._out))
        result.bytes_moved = moved
        return result


class JobLedger:
    """Jobs in flight and results not yet taken: admission (refused once closed),
    exactly-once reporting, `drain`, and stats. Thread-safe; no method blocks on
    I/O except `drain`, which waits on purpose."""

    def __init__(self, stats: StatsRecorder | None = None):
        self._stats = stats
        self._cond = threading.Condition()
        self._finished: list[JobResult] = []
        self._active = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def active(self) -> int:
        """Jobs admitted and not reported yet."""
        return self._active

    def admit(self, then: Callable[[], object] | None = None) -> bool:
        """Count a new job in; False once closed (the job is then reported as
        `closed` without being counted). `then`, when given, is called under the
        ledger's lock once admitted, so that `close` cannot slip in between: it
        must be quick and never block (hand the job to a queue)."""
        with self._cond:
            if self._closed:
                return False
            self._active += 1
            if then is not None:
                then()
            return True

    def close(self) -> None:
        with self._cond:
            self._closed = True

    def report(self, result: JobResult, *, load: bool, counted: bool = True) -> None:
        """Record a job's result (once per job). `counted`: the job was admitted."""
        if self._stats is not None:
            self._stats.job(result, load=load)
        with self._cond:
            self._finished.append(result)
            if counted:
                self._active -= 1
            self._cond.notify_all()

    def take(self) -> list[JobResult]:
        with self._cond:
            done, self._finished = self._finished, []
        return done

    def drain(self, timeout: float | None = None) -> bool:
        """Wait (real time) until no admitted job is unreported; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._active == 0, timeout)


#: a start hook: `start(job) -> indices to run as work items` (see `JobHooks`)
StartHook = Callable[[Job], Iterable[int]]
#: an end hook: `end(job)`, after the job's last item, before its result is reported
EndHook = Callable[[Job], None]
#: called with the exception when tier code raised (after it is logged)
CrashHook = Callable[[BaseException], None]


class JobFlow:
    """The parts of a job's life that do not depend on how items run, shared by
    `JobEngine` (threads) and `AsyncJobEngine` (an event loop): cutting items into
    units, running the start and end hooks with their failures contained, and
    reporting. Engine-internal; a tier never builds one."""

    def __init__(self, ledger: JobLedger, *, logger: logging.Logger, block_bytes: int,
                 batch_bytes: int, on_crash: CrashHook | None, what: str):
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
        self.ledger = ledger
        self.log = logger
        self.block_bytes = block_bytes
        # Items per unit: consecutive small blocks of one job share a unit, so the
        # per-unit cost (queue, wake-up, counters) does not outweigh their I/O.
        self.per_unit = max(1, batch_bytes // block_bytes)
        self._on_crash = on_crash
        self._what = what

    def units(self, indices: Sequence[int]) -> list[Sequence[int]]:
        per = self.per_unit
        if per == 1:
            return [(i,) for i in indices]
        return [indices[i : i + per] for i in range(0, len(indices), per)]

    def crashed(self, job: Job, where: str, exc: BaseException) -> None:
        self.log.error("%s: %s of job %d raised; its keys fail with io", self._what, where,
                       job.job_id, exc_info=exc)
        if self._on_crash is not None:
            try:
                self._on_crash(exc)
            except Exception:
                self.log.exception("%s: crash hook raised", self._what)

    def start(self, job: Job, hook: StartHook) -> list[int] | None:
        """Run a start hook: the indices it returned, or None when it raised (the
        job's unsettled keys then failed with io)."""
        try:
            items = list(hook(job))
        except Exception as exc:  # noqa: BLE001 - a tier bug costs misses, not the engine
            self.crashed(job, "the start hook", exc)
            job._settle_rest(FailureReason.IO)
            return None
        n = len(job.keys)
        if any(not 0 <= i < n for i in items) or len(set(items)) != len(items):
            self.crashed(job, "the start hook", ValueError(
                f"start hook returned indices out of 0..{n - 1} or repeated: {items[:8]}"))
            job._settle_rest(FailureReason.IO)
            return None
        return items

    def end(self, job: Job, hook: EndHook | None, *, counted: bool = True) -> None:
        """The job's last unit has retired: run its end hook, then report it."""
        if hook is not None:
            try:
                hook(job)
            except Exception as exc:  # noqa: BLE001 - a tier bug costs misses, not the engine
                self.crashed(job, "the end hook", exc)
                job._fail_successes(FailureReason.IO)
        self.ledger.report(job._result(self.log), load=job.load, counted=counted)
