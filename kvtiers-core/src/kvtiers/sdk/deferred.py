"""`Deferrals`: the keys a `JobEngine` has deferred (`Job.defer`) and not settled
yet - who settles each one first, its deadline, and `close`.

Each deferred key counts as one work unit of its job until it is settled, so the
job is reported only afterwards (exactly once, as for items). Settling is decided
under one lock (`Deferred._claim`): the first of the tier's `succeed`/`fail`/
`resume`, the deadline and `close` wins, the others return False.

Deadlines are on the tier's clock, which may be a `ManualClock`: a watcher thread,
started at the first deferral of a job that has a deadline and alive while such
keys exist, looks at them every `POLL_S` real seconds at most (sooner when the
earliest deadline is nearer on the clock) and fails the expired ones with
`timeout`. The watcher settles; it never runs tier code itself (the engine hands
the job's end to an engine thread, see `JobEngine`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvtiers.contract.clock import Clock
from kvtiers.contract.jobs import FailureReason
from kvtiers.sdk.job import Deferred, Job

__all__ = ["POLL_S", "Deferrals"]

#: the longest real time between two looks at the deadlines of deferred keys
POLL_S = 0.01

#: `settle(job, i, outcome, moved)`: record a deferred key's outcome, retire its unit
SettleFn = Callable[[Job, int, FailureReason | None, int | None], None]
#: `resume(job, i)`: queue key `i` of `job` as a work item again (its unit goes with it)
ResumeFn = Callable[[Job, int], None]


class Deferrals:
    """The engine's `Deferrer` (see `kvtiers.sdk.job`). Thread-safe."""

    def __init__(self, clock: Clock, *, settle: SettleFn, resume: ResumeFn, name: str):
        self._clock = clock
        self._settle = settle
        self._resume = resume
        self._name = name
        self._cv = threading.Condition()
        self._open: dict[int, Deferred] = {}  # id(handle) -> handle, not settled yet
        self._timed: dict[int, Deferred] = {}  # those of jobs with a deadline
        self._watcher: threading.Thread | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._open)

    # The Deferrer protocol.

    def defer(self, job: Job, i: int) -> Deferred:
        if not 0 <= i < len(job.keys):
            raise IndexError(f"job {job.job_id} has no key {i}")
        d = Deferred(job, i, self)
        job._add_units(1)  # before anyone can settle it (and retire that unit)
        with self._cv:
            if not self._closed:
                self._open[id(d)] = d
                if job.transfer.deadline is not None:
                    self._timed[id(d)] = d
                    self._start_watcher()
                    self._cv.notify()
                return d
            d._claim()
        # Deferred while the engine closes: settled at once, as a queued unit would be.
        self._settle(job, i, FailureReason.CLOSED, None)
        return d

    def settle_deferred(self, d: Deferred, outcome: FailureReason | None,
                        moved: int | None) -> bool:
        if not self._take(d):
            return False
        self._settle(d.job, d.index, outcome, moved)
        return True

    def resume_deferred(self, d: Deferred) -> bool:
        if not self._take(d):
            return False
        self._resume(d.job, d.index)
        return True

    # Engine side.

    def close(self) -> None:
        """Settle every deferred key with `closed` and stop the watcher. Idempotent."""
        with self._cv:
            self._closed = True
            pending = [d for d in self._open.values() if d._claim()]
            self._open.clear()
            self._timed.clear()
            self._cv.notify_all()
            watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()
        for d in pending:
            self._settle(d.job, d.index, FailureReason.CLOSED, None)

    def _take(self, d: Deferred) -> bool:
        with self._cv:
            if not d._claim():
                return False
            self._open.pop(id(d), None)
            self._timed.pop(id(d), None)
            return True

    def _start_watcher(self) -> None:
        """Under the lock."""
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._watch, daemon=True,
                                             name=f"{self._name}-deadlines")
            self._watcher.start()

    def _watch(self) -> None:
        clock = self._clock
        while True:
            with self._cv:
                if self._closed:
                    return
                if not self._timed:
                    # Nothing to watch: end; the next deferral with a deadline starts
                    # another watcher (checked under this same lock, so none is lost).
                    self._watcher = None
                    return
                now = clock()
                expired = [d for d in self._timed.values() if d.job.expired() and d._claim()]
                for d in expired:
                    self._open.pop(id(d), None)
                    self._timed.pop(id(d), None)
                if not expired:
                    nearest = min(d.job.transfer.deadline or now for d in self._timed.values())
                    self._cv.wait(min(POLL_S, max(nearest - now, 0.0) + 1e-4))
            for d in expired:
                self._settle(d.job, d.index, FailureReason.TIMEOUT, None)
