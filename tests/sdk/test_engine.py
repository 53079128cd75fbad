"""`JobEngine`: the bookkeeping it promises tiers - exactly-once results (also under
close races), deadlines on the tier's clock, `closed`, crashes cost `io`, hook order,
batching, loads ahead of stores and stealing - with real threads and Events."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from kvtiers import FailureReason, JobResult, TransferJob
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.stats import StatsRecorder
from kvtiers.contract.tier import TierContext
from kvtiers.sdk import LOAD, STORE, Job, JobEngine, JobHooks, Outcome
from kvtiers.testing import make_context, random_keys, wait_until

BB = 16384


@dataclass
class Script:
    """Records what tier code ran; items wait at `gates[job_id]` when one is set,
    raise for keys in `crash`, fail with `fail[(job_id, i)]`."""

    log: list[tuple[str, int, Any]] = field(default_factory=list)
    gates: dict[int, threading.Event] = field(default_factory=dict)
    entered: dict[int, threading.Event] = field(default_factory=dict)
    crash: set[tuple[int, int]] = field(default_factory=set)
    fail: dict[tuple[int, int], FailureReason] = field(default_factory=dict)
    running: dict[int, int] = field(default_factory=dict)  # job id -> items in flight
    lock: threading.Lock = field(default_factory=threading.Lock)
    on_item: Callable[[Job, int], object] | None = None
    start_override: Callable[[Job], list[int]] | None = None
    end_extra: Callable[[Job], object] | None = None

    def gate(self, job_id: int) -> threading.Event:
        self.gates[job_id] = threading.Event()
        self.entered[job_id] = threading.Event()
        return self.gates[job_id]

    def block(self, job: Job, i: int) -> Outcome:
        with self.lock:
            self.running[job.job_id] = self.running.get(job.job_id, 0) + 1
            self.log.append(("item", job.job_id, i))
        try:
            if job.job_id in self.entered:
                self.entered[job.job_id].set()
            if job.job_id in self.gates:
                assert self.gates[job.job_id].wait(30), "gate never opened"
            if self.on_item is not None:
                self.on_item(job, i)
            if (job.job_id, i) in self.crash:
                raise RuntimeError(f"boom in {job.job_id}/{i}")
            return self.fail.get((job.job_id, i))
        finally:
            with self.lock:
                self.running[job.job_id] -= 1

    def batch(self, job: Job, indices: Sequence[int]) -> list[Outcome]:
        with self.lock:
            self.log.append(("batch", job.job_id, tuple(indices)))
        if (job.job_id, -1) in self.crash:
            raise RuntimeError("batch boom")
        return [self.fail.get((job.job_id, i)) for i in indices]

    def start(self, job: Job) -> list[int]:
        if self.start_override is not None:
            return self.start_override(job)
        with self.lock:
            self.log.append(("start", job.job_id, None))
        if (job.job_id, -2) in self.crash:
            raise RuntimeError("start boom")
        # Even keys need I/O; odd keys are "present" (no I/O).
        for i in range(1, len(job.keys), 2):
            job.succeed(i)
        return list(range(0, len(job.keys), 2))

    def end(self, job: Job) -> None:
        with self.lock:
            # Nothing of the job may still run when its end hook (and report) comes.
            assert self.running.get(job.job_id, 0) == 0, "end hook while items run"
            self.log.append(("end", job.job_id, job.state))
        if self.end_extra is not None:
            self.end_extra(job)
        if (job.job_id, -3) in self.crash:
            raise RuntimeError("end boom")

    def events(self, job_id: int) -> list[str]:
        return [kind for kind, j, _ in self.log if j == job_id]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ctx(clock: ManualClock) -> TierContext:
    return make_context(BB, 64, clock=clock)


Engines = Callable[..., JobEngine]


@pytest.fixture
def engines(ctx: TierContext) -> Iterator[Engines]:
    made: list[tuple[JobEngine, Script]] = []

    def make(script: Script, *, store_start: bool = True, batch: bool = False,
             **kwargs: Any) -> JobEngine:
        batch_fn = script.batch if batch else None
        engine = JobEngine(
            ctx, load=JobHooks(script.block, batch_fn, None, script.end),
            store=JobHooks(script.block, batch_fn, script.start if store_start else None,
                           script.end), **kwargs)
        made.append((engine, script))
        return engine

    yield make
    for engine, script in made:
        for gate in script.gates.values():
            gate.set()
        engine.close()


def job(job_id: int, n: int = 1, deadline: float | None = None) -> TransferJob:
    return TransferJob(job_id, random_keys(n), list(range(n)), deadline)


def collect(engine: JobEngine, ids: Sequence[int]) -> dict[int, JobResult]:
    out: dict[int, JobResult] = {}

    def enough() -> bool:
        for r in engine.take_finished():
            assert r.job_id not in out, f"job {r.job_id} reported twice"
            out[r.job_id] = r
        return all(i in out for i in ids)

    wait_until(enough, f"results of {list(ids)}")
    return out


def reasons(result: JobResult) -> set[FailureReason]:
    return set(result.failed.values())


# Hooks, results, stats.


def test_a_store_runs_start_then_its_items_then_end_then_reports(engines: Engines) -> None:
    script = Script()
    stats = StatsRecorder()
    engine = engines(script, load_threads=2, store_threads=2, stats=stats)
    j = job(1, 5)
    engine.submit_store(j, state="mine")
    result = collect(engine, [1])[1]
    assert result.ok == list(j.keys) and result.success
    events = script.events(1)
    assert events[0] == "start" and events[-1] == "end"
    assert sorted(i for kind, _, i in script.log if kind == "item") == [0, 2, 4]
    assert ("end", 1, "mine") in script.log  # the submit state reaches the hooks
    # Only items moved bytes: the odd keys were settled without I/O.
    assert result.bytes_moved == 3 * BB and result.seconds > 0
    snap = stats.snapshot(0)
    assert (snap.blocks_written, snap.bytes_written, snap.blocks_read) == (5, 3 * BB, 0)


def test_the_end_hook_runs_before_the_job_is_reported(engines: Engines) -> None:
    script = Script()
    seen: list[int] = []
    engines_made: list[JobEngine] = []
    script.end_extra = lambda j: seen.append(engines_made[0].pending)
    engine = engines(script)
    engines_made.append(engine)
    engine.submit_load(job(1, 2))
    collect(engine, [1])
    assert seen == [1] and engine.pending == 0


def test_an_end_hook_may_fail_keys_that_succeeded(engines: Engines) -> None:
    script = Script()
    script.end_extra = lambda j: j.fail(0, FailureReason.IO)
    engine = engines(script)
    j = job(1, 3)
    engine.submit_load(j)
    result = collect(engine, [1])[1]
    assert result.failed == {j.keys[0]: FailureReason.IO}
    assert result.ok == list(j.keys[1:]) and result.bytes_moved == 2 * BB


def test_an_empty_job_is_reported_at_once(engines: Engines) -> None:
    engine = engines(Script())
    engine.submit_store(TransferJob(1, [], []))
    assert [(r.job_id, r.ok, r.failed) for r in engine.take_finished()] == [(1, [], {})]


def test_keys_the_tier_never_settles_fail_with_io(
    engines: Engines, caplog: pytest.LogCaptureFixture
) -> None:
    script = Script()
    script.start_override = lambda j: []  # settles nothing
    engine = engines(script)
    j = job(1, 2)
    engine.submit_store(j)
    assert reasons(collect(engine, [1])[1]) == {FailureReason.IO}
    assert "neither way" in caplog.text


def test_thread_counts_are_checked(ctx: TierContext) -> None:
    hooks = JobHooks(block=Script().block)
    with pytest.raises(ValueError, match="thread counts"):
        JobEngine(ctx, load=hooks, store=hooks, load_threads=0, store_threads=0)


# Batching.


def test_consecutive_small_blocks_share_a_unit_and_go_to_batch(engines: Engines) -> None:
    script = Script()
    engine = engines(script, batch=True, batch_bytes=4 * BB, load_threads=1, store_threads=0)
    j = job(1, 10)
    script.fail[(1, 5)] = FailureReason.MISSING
    engine.submit_load(j)
    result = collect(engine, [1])[1]
    batches = [i for kind, _, i in script.log if kind == "batch"]
    assert batches == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    assert result.failed == {j.keys[5]: FailureReason.MISSING} and len(result.ok) == 9


def test_blocks_as_large_as_the_batch_get_a_unit_each(engines: Engines) -> None:
    script = Script()
    engine = engines(script, batch=True, batch_bytes=BB)
    engine.submit_load(job(1, 3))
    collect(engine, [1])
    assert [(k, i) for k, _, i in script.log if k != "end"] == [("item", 0), ("item", 1),
                                                                ("item", 2)]


def test_without_a_batch_hook_a_unit_runs_its_items_in_order(engines: Engines) -> None:
    script = Script()
    engine = engines(script, batch_bytes=8 * BB, load_threads=1, store_threads=0)
    engine.submit_load(job(1, 5))
    collect(engine, [1])
    assert [i for k, _, i in script.log if k == "item"] == [0, 1, 2, 3, 4]


# Deadlines, on the tier's clock.


def test_a_job_taken_after_its_deadline_runs_no_tier_code(
    engines: Engines, clock: ManualClock
) -> None:
    script = Script()
    engine = engines(script, load_threads=1, store_threads=0)
    script.gate(1)
    engine.submit_load(job(1))
    assert script.entered[1].wait(30)  # the only thread is busy
    engine.submit_store(job(2, 4, deadline=clock() + 5))
    engine.submit_load(job(3, 2, deadline=clock() + 5))
    clock.advance(10)
    script.gates[1].set()
    results = collect(engine, [1, 2, 3])
    assert results[1].success
    assert reasons(results[2]) == reasons(results[3]) == {FailureReason.TIMEOUT}
    # Neither the start hook nor an item ran; the end hooks did.
    assert script.events(2) == ["end"] and script.events(3) == ["end"]


def test_items_taken_after_the_deadline_passed_mid_job_time_out(
    engines: Engines, clock: ManualClock
) -> None:
    script = Script()
    engine = engines(script, load_threads=1, store_threads=0, batch_bytes=BB)

    def late(j: Job, i: int) -> None:
        if i == 1:
            clock.advance(10)  # the deadline passes while item 1 runs

    script.on_item = late
    j = job(1, 4, deadline=clock() + 5)
    engine.submit_load(j)
    result = collect(engine, [1])[1]
    assert result.ok == list(j.keys[:2])
    assert result.failed == dict.fromkeys(j.keys[2:], FailureReason.TIMEOUT)
    assert [i for k, _, i in script.log if k == "item"] == [0, 1]


# Closed.


def test_close_fails_queued_jobs_and_reports_the_running_one(engines: Engines) -> None:
    script = Script()
    engine = engines(script, load_threads=1, store_threads=0)
    script.gate(1)
    engine.submit_store(job(1, 2), state="s1")
    assert script.entered[1].wait(30)
    engine.submit_load(job(2, 3), state="pins")
    engine.submit_store(job(3, 2), state="s3")
    closer = threading.Thread(target=engine.close)
    closer.start()
    wait_until(lambda: ("end", 2, "pins") in script.log, "the queued load ended")
    script.gates[1].set()
    closer.join(30)
    assert not closer.is_alive()
    engine.submit_load(job(4), state="late")  # after close
    results = collect(engine, [1, 2, 3, 4])
    assert results[1].success
    for i in (2, 3, 4):
        assert reasons(results[i]) == {FailureReason.CLOSED}
    # Every job's end hook ran once (pins taken at submit are always given back).
    assert sorted(j for k, j, _ in script.log if k == "end") == [1, 2, 3, 4]
    assert engine.drain(0) and engine.pending == 0 and engine.closed
    assert engine.close()  # idempotent


@pytest.mark.parametrize("threads", [(1, 0), (2, 2)])
def test_every_job_is_reported_exactly_once_when_close_races_submits(
    engines: Engines, threads: tuple[int, int]
) -> None:
    """Submitters keep submitting while another thread closes: each job is reported
    once, every key settled, and never while an item of it still runs."""
    script = Script()
    engine = engines(script, load_threads=threads[0], store_threads=threads[1],
                     batch_bytes=2 * BB)
    submitted: list[TransferJob] = []
    go, stop = threading.Event(), threading.Event()

    def submitter(base: int) -> None:
        assert go.wait(30)
        n = 0
        while not stop.is_set() and n < 400:
            j = job(base + n, 1 + n % 5)
            submitted.append(j)
            (engine.submit_load if n % 2 else engine.submit_store)(j)
            n += 1

    threads_ = [threading.Thread(target=submitter, args=(b,)) for b in (0, 10_000)]
    for t in threads_:
        t.start()
    go.set()
    wait_until(lambda: len(submitted) >= 100, "some jobs submitted")
    engine.close()
    stop.set()
    for t in threads_:
        t.join(30)
    results = collect(engine, [j.job_id for j in submitted])
    assert len(results) == len(submitted)
    for j in submitted:
        r = results[j.job_id]
        assert set(r.ok) | set(r.failed) == set(j.keys) and not set(r.ok) & set(r.failed)
        assert reasons(r) <= {FailureReason.CLOSED}
    assert engine.pending == 0 and engine.take_finished() == []


# Crashes in tier code cost io, never a thread.


def test_an_item_that_raises_fails_its_key_and_the_thread_lives_on(
    engines: Engines, caplog: pytest.LogCaptureFixture
) -> None:
    script = Script()
    crashes: list[BaseException] = []
    engine = engines(script, load_threads=1, store_threads=0, on_crash=crashes.append)
    script.crash.add((1, 1))
    j = job(1, 3)
    engine.submit_load(j)
    engine.submit_load(job(2, 2))
    results = collect(engine, [1, 2])
    assert results[1].failed == {j.keys[1]: FailureReason.IO} and len(results[1].ok) == 2
    assert results[2].success
    assert [str(e) for e in crashes] == ["boom in 1/1"]
    assert "boom in 1/1" in caplog.text


def test_an_item_returning_no_outcome_fails_its_key_with_io(engines: Engines) -> None:
    script = Script()
    script.fail[(1, 0)] = "not a reason"  # type: ignore[assignment]
    engine = engines(script)
    j = job(1, 2)
    engine.submit_load(j)
    assert collect(engine, [1])[1].failed == {j.keys[0]: FailureReason.IO}


def test_a_batch_that_raises_fails_its_unit(engines: Engines) -> None:
    script = Script()
    engine = engines(script, batch=True, batch_bytes=2 * BB)
    script.crash.add((1, -1))
    engine.submit_load(job(1, 3))
    assert reasons(collect(engine, [1])[1]) == {FailureReason.IO}


def test_a_start_hook_that_raises_fails_the_job_and_end_still_runs(engines: Engines) -> None:
    script = Script()
    engine = engines(script)
    script.crash.add((1, -2))
    engine.submit_store(job(1, 3), state="res")
    assert reasons(collect(engine, [1])[1]) == {FailureReason.IO}
    assert script.events(1) == ["start", "end"]


def test_an_end_hook_that_raises_fails_what_succeeded(engines: Engines) -> None:
    script = Script()
    engine = engines(script)
    script.crash.add((1, -3))
    engine.submit_store(job(1, 3))
    result = collect(engine, [1])[1]
    assert reasons(result) == {FailureReason.IO} and result.ok == []
    engine.submit_store(job(2, 2))
    assert collect(engine, [2])[2].success


def test_a_start_hook_returning_bad_indices_is_a_crash(
    engines: Engines, caplog: pytest.LogCaptureFixture
) -> None:
    script = Script()
    script.start_override = lambda j: [0, 0]
    engine = engines(script)
    with caplog.at_level(logging.ERROR):
        engine.submit_store(job(1, 2))
        assert reasons(collect(engine, [1])[1]) == {FailureReason.IO}
    assert "repeated" in caplog.text


# Scheduling: loads ahead of stores, a started job first, stealing.


def test_loads_run_before_queued_stores(engines: Engines) -> None:
    script = Script()
    engine = engines(script, store_start=False, load_threads=1, store_threads=0)
    script.gate(1)
    engine.submit_store(job(1))
    assert script.entered[1].wait(30)
    engine.submit_store(job(2))
    engine.submit_load(job(3))
    script.gates[1].set()
    collect(engine, [1, 2, 3])
    assert [j for k, j, _ in script.log if k == "item"] == [1, 3, 2]


def test_a_started_store_writes_before_later_jobs_start(engines: Engines) -> None:
    script = Script()
    engine = engines(script, load_threads=1, store_threads=0, batch_bytes=BB)
    script.gate(9)
    engine.submit_load(job(9))
    assert script.entered[9].wait(30)
    engine.submit_store(job(1, 4))
    engine.submit_store(job(2, 4))
    script.gates[9].set()
    collect(engine, [1, 2, 9])
    order = [(k, j) for k, j, _ in script.log if j != 9]
    assert order == [("start", 1), ("item", 1), ("item", 1), ("end", 1),
                     ("start", 2), ("item", 2), ("item", 2), ("end", 2)]


def test_an_idle_load_thread_takes_store_work(engines: Engines) -> None:
    script = Script()
    engine = engines(script, store_start=False, load_threads=1, store_threads=1,
                     batch_bytes=BB)
    both = threading.Barrier(3)
    script.on_item = lambda j, i: both.wait(30)  # both threads inside a store at once
    engine.submit_store(job(1, 2))
    both.wait(30)
    collect(engine, [1])
    engine.close()
    assert engine.pool.ran[(LOAD, STORE)] == 1 and engine.pool.ran[(STORE, STORE)] == 1


def test_drain_waits_for_running_jobs(engines: Engines) -> None:
    script = Script()
    engine = engines(script)
    script.gate(1)
    engine.submit_load(job(1))
    assert script.entered[1].wait(30)
    assert engine.drain(0.01) is False
    script.gates[1].set()
    assert engine.drain(30) is True
    assert [r.job_id for r in engine.take_finished()] == [1]


def test_store_kind_is_reported_as_a_store(engines: Engines) -> None:
    stats = StatsRecorder()
    engine = engines(Script(), stats=stats, store_start=False)
    engine.submit_store(job(1, 2))
    engine.submit_load(job(2, 3))
    collect(engine, [1, 2])
    snap = stats.snapshot(0)
    assert (snap.blocks_written, snap.blocks_read) == (2, 3)
    assert STORE == "store"
