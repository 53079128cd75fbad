"""`JobWorkers`: the bookkeeping it promises tiers (exactly-once results, closed and
timeout handling, crash isolation, loads before stores)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kvtiers import FailureReason, JobResult, TransferJob
from kvtiers.clock import ManualClock
from kvtiers.stats import StatsRecorder
from kvtiers.testing import random_keys, wait_until
from kvtiers.tiers import JobWorkers


class Recorder:
    """A `run` that records the order of jobs, optionally held at a gate, or raising."""

    def __init__(self) -> None:
        self.ran: list[tuple[int, bool]] = []
        self.cancelled: list[tuple[int, Any]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.crash_ids: set[int] = set()

    def run(self, job: TransferJob, load: bool, state: Any) -> JobResult:
        self.entered.set()
        assert self.gate.wait(30)
        if job.job_id in self.crash_ids:
            raise RuntimeError("boom")
        self.ran.append((job.job_id, load))
        return JobResult(job.job_id, list(job.keys), bytes_moved=len(job.keys))

    def cancel(self, job: TransferJob, load: bool, state: Any) -> None:
        self.cancelled.append((job.job_id, state))


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def workers(rec: Recorder, clock: ManualClock) -> Iterator[JobWorkers]:
    w = JobWorkers(rec.run, threads=1, clock=clock, on_cancel=rec.cancel, stats=StatsRecorder())
    yield w
    rec.gate.set()
    w.close()


def job(job_id: int, n: int = 1, deadline: float | None = None) -> TransferJob:
    return TransferJob(job_id, random_keys(n), list(range(n)), deadline)


def collect(w: JobWorkers, count: int) -> dict[int, JobResult]:
    out: dict[int, JobResult] = {}

    def enough() -> bool:
        for r in w.take_finished():
            assert r.job_id not in out, "reported twice"
            out[r.job_id] = r
        return len(out) >= count

    wait_until(enough, f"{count} results")
    return out


def test_loads_run_before_queued_stores(rec: Recorder, workers: JobWorkers) -> None:
    rec.gate.clear()
    workers.submit(job(1), load=False)
    assert rec.entered.wait(30)  # the only thread is busy with job 1
    workers.submit(job(2), load=False)
    workers.submit(job(3), load=True)
    rec.gate.set()
    collect(workers, 3)
    assert rec.ran == [(1, False), (3, True), (2, False)]


def test_a_crash_fails_the_job_with_io_and_the_worker_lives_on(
    rec: Recorder, workers: JobWorkers
) -> None:
    rec.crash_ids.add(1)
    workers.submit(job(1, 2), load=True)
    workers.submit(job(2), load=True)
    results = collect(workers, 2)
    assert set(results[1].failed.values()) == {FailureReason.IO}
    assert results[2].success


def test_a_job_past_its_deadline_is_not_run(
    rec: Recorder, workers: JobWorkers, clock: ManualClock
) -> None:
    workers.submit(job(1, deadline=clock() - 1), load=True, state="pins")
    result = collect(workers, 1)[1]
    assert set(result.failed.values()) == {FailureReason.TIMEOUT}
    assert rec.ran == [] and rec.cancelled == [(1, "pins")]


def test_close_cancels_queued_jobs_and_reports_the_running_one(
    rec: Recorder, workers: JobWorkers
) -> None:
    rec.gate.clear()
    workers.submit(job(1), load=False)
    assert rec.entered.wait(30)
    workers.submit(job(2), load=True, state="pins")
    closer = threading.Thread(target=workers.close)
    closer.start()
    wait_until(lambda: rec.cancelled == [(2, "pins")], "queued job cancelled")
    rec.gate.set()
    closer.join(30)
    assert not closer.is_alive()
    workers.submit(job(3), load=False)  # after close
    results = collect(workers, 3)
    assert results[1].success
    assert set(results[2].failed.values()) == {FailureReason.CLOSED}
    assert set(results[3].failed.values()) == {FailureReason.CLOSED}
    assert workers.drain(0) and workers.pending == 0
    workers.close()  # idempotent


def test_drain_waits_for_running_jobs(rec: Recorder, workers: JobWorkers) -> None:
    rec.gate.clear()
    workers.submit(job(1), load=False)
    assert rec.entered.wait(30)
    assert workers.drain(0.01) is False
    rec.gate.set()
    assert workers.drain(30) is True
    assert [r.job_id for r in workers.take_finished()] == [1]


def test_rejects_zero_threads(rec: Recorder) -> None:
    with pytest.raises(ValueError):
        JobWorkers(rec.run, threads=0)
