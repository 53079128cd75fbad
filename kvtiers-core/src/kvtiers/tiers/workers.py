"""`JobWorkers`: a tier's own I/O threads, with the bookkeeping every tier needs.

A tier hands each submitted job to `submit` (never blocks) and gives back what
`take_finished` returns from its `get_finished_jobs`. The helper keeps the
contract's promises so each tier does not re-derive them:

- every job is reported exactly once, when `run` has returned (so none of the
  tier's I/O for it can still touch its slots);
- a job whose deadline passed before a worker picked it up fails with `timeout`
  without running; one queued when the tier closes, or submitted after, fails with
  `closed`; `on_cancel` lets the tier release what it took at submit (pins);
- an exception escaping `run` fails the job's keys with `io` and is logged: a tier
  bug costs misses, not a dead worker thread;
- loads are taken before stores (a load is on an engine request's critical path,
  a store is a copy that can wait), each queue in submission order.

Used by the `memory` tier; other tiers may use it as is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvtiers.clock import Clock, monotonic
from kvtiers.jobs import FailureReason, JobResult, TransferJob
from kvtiers.stats import StatsRecorder

#: `run(job, load, state) -> JobResult`, called on a worker thread.
RunFn = Callable[[TransferJob, bool, Any], JobResult]
#: `on_cancel(job, load, state)`: the job will not run (closed, or past its deadline).
CancelFn = Callable[[TransferJob, bool, Any], None]


@dataclass(slots=True)
class _Queued:
    job: TransferJob
    load: bool
    state: Any


class JobWorkers:
    """A pool of `threads` daemon threads running one tier's jobs.

    `submit`, `take_finished`, `drain` and `close` may be called from any thread;
    `run` and `on_cancel` are called on worker threads (or, for jobs cancelled by
    `close`/`submit`, on the caller's thread) and never under the helper's lock.
    `stats`, when given, records every result the helper emits.
    """

    def __init__(
        self,
        run: RunFn,
        *,
        threads: int = 1,
        name: str = "kvtiers-tier",
        clock: Clock = monotonic,
        stats: StatsRecorder | None = None,
        on_cancel: CancelFn | None = None,
        logger: logging.Logger | None = None,
        loads_first: bool = True,
    ):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._run = run
        self._clock = clock
        self._stats = stats
        self._on_cancel = on_cancel
        self._log = logger or logging.getLogger("kvtiers.tier")
        self._loads_first = loads_first
        self._cond = threading.Condition()
        self._loads: deque[_Queued] = deque()
        self._stores: deque[_Queued] = deque()
        self._finished: list[JobResult] = []
        self._active = 0  # queued + running
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return self._active

    def submit(self, job: TransferJob, *, load: bool, state: Any = None) -> None:
        """Queue a job. Never blocks on I/O; after `close` the job fails with `closed`."""
        with self._cond:
            if not self._closed:
                (self._loads if load else self._stores).append(_Queued(job, load, state))
                self._active += 1
                self._cond.notify_all()
                return
        self._cancel(_Queued(job, load, state), FailureReason.CLOSED)

    def take_finished(self) -> list[JobResult]:
        """Results of the jobs that ended since the last call. Never blocks on I/O."""
        with self._cond:
            done, self._finished = self._finished, []
        return done

    def drain(self, timeout: float | None = None) -> bool:
        """Wait (real time) until no job is queued or running; False if `timeout` passed."""
        with self._cond:
            return self._cond.wait_for(lambda: self._active == 0, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Fail queued jobs with `closed`, let running ones finish, stop the threads.

        Idempotent. Returns False when a thread was still running a job after
        `timeout` (its result is still reported when it ends).
        """
        with self._cond:
            cancelled = [*self._loads, *self._stores] if not self._closed else []
            self._loads.clear()
            self._stores.clear()
            self._closed = True
            self._cond.notify_all()
        for item in cancelled:
            self._cancel(item, FailureReason.CLOSED, counted=True)
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout)
        return not any(t.is_alive() for t in self._threads if t is not me)

    # Worker side.

    def _next(self) -> _Queued | None:
        """The next job to run, or None when closed and nothing is left. Holds the lock."""
        while True:
            first, second = (
                (self._loads, self._stores) if self._loads_first else (self._stores, self._loads)
            )
            if first:
                return first.popleft()
            if second:
                return second.popleft()
            if self._closed:
                return None
            self._cond.wait()

    def _work(self) -> None:
        while True:
            with self._cond:
                item = self._next()
            if item is None:
                return
            result = self._execute(item)
            self._finish(result, item.load, counted=True)

    def _execute(self, item: _Queued) -> JobResult:
        job = item.job
        if job.deadline is not None and self._clock() > job.deadline:
            self._call_cancel(item)
            return JobResult.all_failed(job, FailureReason.TIMEOUT)
        start = time.perf_counter()
        try:
            result = self._run(job, item.load, item.state)
        except Exception:
            self._log.exception("job %d crashed; its keys fail with io", job.job_id)
            result = JobResult.all_failed(job, FailureReason.IO)
        if not result.seconds:
            result.seconds = time.perf_counter() - start
        return result

    def _cancel(self, item: _Queued, reason: FailureReason, counted: bool = False) -> None:
        self._call_cancel(item)
        self._finish(JobResult.all_failed(item.job, reason), item.load, counted)

    def _call_cancel(self, item: _Queued) -> None:
        if self._on_cancel is None:
            return
        try:
            self._on_cancel(item.job, item.load, item.state)
        except Exception:
            self._log.exception("cancelling job %d failed", item.job.job_id)

    def _finish(self, result: JobResult, load: bool, counted: bool) -> None:
        if self._stats is not None:
            self._stats.job(result, load=load)
        with self._cond:
            self._finished.append(result)
            if counted:
                self._active -= 1
            self._cond.notify_all()
