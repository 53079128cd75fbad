"""`Job.defer`: an item that waits for something else returns a `Deferred` instead of
sleeping on its thread. Exactly one of the tier's settle/resume, the deadline and
close decides; the job is reported once, after the deferred key is settled, with
its end hook on an engine thread; the thread is free meanwhile."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from kvtiers import FailureReason, JobResult, TransferJob
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.tier import TierContext
from kvtiers.sdk import Deferred, Job, JobEngine, JobHooks, Outcome
from kvtiers.testing import make_context, random_keys, wait_until

BB = 16384
NAME = "kvtiers-deferral-test"


class Tier:
    """Items of keys in `wait` defer and hand their handle to `handles`; a resumed
    item (state says so) succeeds. Records ends with the thread they ran on."""

    def __init__(self) -> None:
        self.wait: set[tuple[int, int]] = set()
        self.handles: dict[tuple[int, int], Deferred] = {}
        self.runs: list[tuple[int, int]] = []
        self.ends: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        self.got = threading.Condition(self.lock)
        self.gates: dict[int, threading.Event] = {}
        self.entered: dict[int, threading.Event] = {}

    def gate(self, job_id: int) -> threading.Event:
        self.gates[job_id] = threading.Event()
        self.entered[job_id] = threading.Event()
        return self.gates[job_id]

    def block(self, job: Job, i: int) -> Outcome:
        if job.job_id in self.gates:
            self.entered[job.job_id].set()
            assert self.gates[job.job_id].wait(30)
        with self.lock:
            self.runs.append((job.job_id, i))
            if (job.job_id, i) in self.wait and not (job.state or {}).get(i):
                d = job.defer(i)
                self.handles[(job.job_id, i)] = d
                self.got.notify_all()
                return d
        return None

    def end(self, job: Job) -> None:
        with self.lock:
            self.ends.append((job.job_id, threading.current_thread().name))

    def handle(self, job_id: int, i: int = 0, timeout: float = 30) -> Deferred:
        with self.got:
            assert self.got.wait_for(lambda: (job_id, i) in self.handles, timeout)
            return self.handles[(job_id, i)]

    def handle_if(self, job_id: int, i: int, timeout: float) -> Deferred | None:
        with self.got:
            self.got.wait_for(lambda: (job_id, i) in self.handles, timeout)
            return self.handles.get((job_id, i))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ctx(clock: ManualClock) -> TierContext:
    return make_context(BB, 64, clock=clock)


@pytest.fixture
def engine_for(ctx: TierContext) -> Iterator[Callable[..., JobEngine]]:
    made: list[JobEngine] = []

    def make(tier: Tier, **kw: Any) -> JobEngine:
        hooks = JobHooks(block=tier.block, end=tier.end)
        engine = JobEngine(ctx, load=hooks, store=hooks, name=NAME,
                           **{"load_threads": 1, "store_threads": 0, **kw})
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def job(job_id: int, n: int = 1, deadline: float | None = None) -> TransferJob:
    return TransferJob(job_id, random_keys(n), list(range(n)), deadline)


class Results:
    def __init__(self, engine: JobEngine):
        self.engine = engine
        self.got: dict[int, JobResult] = {}

    def poll(self) -> None:
        for r in self.engine.take_finished():
            assert r.job_id not in self.got, f"job {r.job_id} reported twice"
            self.got[r.job_id] = r

    def wait(self, ids: Sequence[int]) -> dict[int, JobResult]:
        def enough() -> bool:
            self.poll()
            return all(i in self.got for i in ids)

        wait_until(enough, f"results of {list(ids)}")
        return self.got

    def none_for(self, job_id: int, polls: int = 30) -> bool:
        for _ in range(polls):
            self.poll()
            if job_id in self.got:
                return False
            threading.Event().wait(0.002)
        return True


def test_a_deferred_key_frees_the_thread_and_is_settled_from_another(
        engine_for: Callable[..., JobEngine]) -> None:
    tier = Tier()
    engine = engine_for(tier)  # one thread in all
    tier.wait.add((1, 1))
    a = job(1, 3)
    engine.submit_load(a)
    d = tier.handle(1, 1)
    results = Results(engine)
    # The only thread goes on: the rest of job 1 and all of job 2 run meanwhile.
    engine.submit_load(job(2, 2))
    assert results.wait([2])[2].success
    assert results.none_for(1) and engine.pending == 1 and engine.deferred == 1
    assert not d.done
    settler = threading.Thread(target=lambda: d.succeed(0), name="some-other-thread")
    settler.start()
    settler.join(30)
    r1 = results.wait([1])[1]
    assert r1.ok == list(a.keys) and r1.bytes_moved == 2 * BB  # the deferred one moved 0
    assert d.done and engine.deferred == 0
    # Its end ran on an engine thread, after the last key was settled.
    assert [(j, name.startswith(NAME)) for j, name in tier.ends] == [(2, True), (1, True)]


def test_a_deferred_key_is_settled_exactly_once(
        engine_for: Callable[..., JobEngine]) -> None:
    tier = Tier()
    engine = engine_for(tier)
    tier.wait.add((1, 0))
    a = job(1)
    engine.submit_store(a)
    d = tier.handle(1)
    assert d.fail(FailureReason.MISSING)
    assert not d.succeed() and not d.fail(FailureReason.IO) and not d.resume()
    results = Results(engine)
    assert results.wait([1])[1].failed == {a.keys[0]: FailureReason.MISSING}
    assert not d.succeed()
    assert results.none_for(2) and tier.runs == [(1, 0)]  # never run again
    assert len(tier.ends) == 1


def test_a_deferred_key_fails_with_timeout_when_its_deadline_passes(
        engine_for: Callable[..., JobEngine], clock: ManualClock) -> None:
    tier = Tier()
    engine = engine_for(tier)
    tier.wait.add((1, 0))
    a = job(1, 2, deadline=clock() + 5)
    engine.submit_load(a)
    d = tier.handle(1)
    results = Results(engine)
    assert results.none_for(1)
    clock.advance(4)  # not yet
    assert results.none_for(1)
    clock.advance(2)
    r = results.wait([1])[1]
    assert r.failed == {a.keys[0]: FailureReason.TIMEOUT} and r.ok == [a.keys[1]]
    assert d.done and not d.succeed() and not d.resume()
    assert tier.ends and tier.ends[0][1].startswith(NAME)


def test_a_resumed_key_runs_its_item_again(engine_for: Callable[..., JobEngine]) -> None:
    tier = Tier()
    engine = engine_for(tier)
    tier.wait.add((1, 0))
    a = job(1)
    engine.submit_load(a, state={})
    d = tier.handle(1)
    d.job.state[0] = True  # what the item is to do now
    assert d.resume() and not d.resume() and not d.succeed()
    r = Results(engine).wait([1])[1]
    assert r.ok == list(a.keys) and r.bytes_moved == BB
    assert tier.runs == [(1, 0), (1, 0)]


def test_a_key_resumed_after_its_deadline_runs_no_tier_code(
        engine_for: Callable[..., JobEngine], clock: ManualClock) -> None:
    tier = Tier()
    engine = engine_for(tier)
    tier.wait.add((1, 0))
    a = job(1, deadline=clock() + 5)
    engine.submit_load(a, state={})
    d = tier.handle(1)
    gate = tier.gate(2)
    engine.submit_load(job(2))
    assert tier.entered[2].wait(30)  # the only thread is busy with job 2
    d.job.state[0] = True
    assert d.resume()  # queued at the head, behind nothing but the running item
    clock.advance(10)
    gate.set()
    results = Results(engine).wait([1, 2])
    assert results[1].failed == {a.keys[0]: FailureReason.TIMEOUT}
    assert results[2].success and tier.runs == [(1, 0), (2, 0)]


def test_close_fails_a_deferred_key_with_closed(
        engine_for: Callable[..., JobEngine]) -> None:
    tier = Tier()
    engine = engine_for(tier)
    tier.wait.add((1, 1))
    a = job(1, 2)
    engine.submit_store(a)
    d = tier.handle(1, 1)
    assert engine.close()
    r = Results(engine).wait([1])[1]
    assert r.failed == {a.keys[1]: FailureReason.CLOSED} and r.ok == [a.keys[0]]
    assert d.done and not d.succeed() and not d.resume()
    assert [j for j, _ in tier.ends] == [1] and engine.pending == 0


def test_a_key_deferred_while_the_engine_closes_is_closed_at_once(
        engine_for: Callable[..., JobEngine]) -> None:
    tier = Tier()
    engine = engine_for(tier)
    tier.wait.add((1, 0))
    gate = tier.gate(1)  # the item defers only after close has begun
    engine.submit_load(job(1))
    assert tier.entered[1].wait(30)
    closer = threading.Thread(target=engine.close)
    closer.start()
    wait_until(lambda: engine.closed, "close began")
    gate.set()
    closer.join(30)
    d = tier.handle(1)
    assert d.done and not d.succeed()
    assert set(Results(engine).wait([1])[1].failed.values()) == {FailureReason.CLOSED}


def test_defer_is_refused_for_a_key_out_of_range(engine_for: Callable[..., JobEngine],
                                                 ctx: TierContext) -> None:
    seen: list[BaseException] = []

    def block(j: Job, i: int) -> Outcome:
        try:
            j.defer(7)
        except IndexError as exc:
            seen.append(exc)
        return None

    hooks = JobHooks(block=block)
    engine = JobEngine(ctx, load=hooks, store=hooks, load_threads=1, store_threads=0)
    try:
        engine.submit_load(job(1))
        assert Results(engine).wait([1])[1].success and len(seen) == 1
        assert engine.deferred == 0
    finally:
        engine.close()


@pytest.mark.parametrize("seed", range(3))
def test_every_job_is_reported_once_when_settles_race_deadlines_and_close(
        engine_for: Callable[..., JobEngine], clock: ManualClock, seed: int) -> None:
    """Settlers, the clock and close race over many deferred keys: each job is
    reported once, and a key is ok exactly when its handle's `succeed` returned True."""
    rng = random.Random(seed)
    tier = Tier()
    engine = engine_for(tier, load_threads=2, store_threads=2)
    jobs = [job(n, 3, deadline=clock() + rng.choice([1, 2, 3]) if n % 2 else None)
            for n in range(1, 61)]
    for j in jobs:
        tier.wait.update((j.job_id, i) for i in range(3) if rng.random() < 0.7)
    won: dict[tuple[int, int], FailureReason | str | None] = {}
    wlock = threading.Lock()

    def settler(picks: list[tuple[int, int]], coin: random.Random) -> None:
        for key in picks:
            # A key whose job timed out or closed before its item ran has no handle.
            d = tier.handle_if(*key, timeout=0.2)
            if d is None:
                continue
            if coin.random() < 0.5:
                outcome = None if d.succeed() else "lost"
            else:
                outcome = FailureReason.IO if d.fail(FailureReason.IO) else "lost"
            with wlock:
                won[key] = outcome

    for j in jobs:
        (engine.submit_load if j.job_id % 3 else engine.submit_store)(j)
    keys = sorted(tier.wait)
    rng.shuffle(keys)
    threads = [threading.Thread(target=settler, args=(keys[k::3], random.Random(seed + k)))
               for k in range(3)]
    for t in threads:
        t.start()
    for _ in range(3):
        clock.advance(1)
    threads[0].join(30)
    engine.close()
    for t in threads:
        t.join(30)
    results = Results(engine).wait([j.job_id for j in jobs])
    assert len(tier.ends) == len(jobs)
    for j in jobs:
        r = results[j.job_id]
        assert len(r.ok) + len(r.failed) == 3
        for i, key in enumerate(j.keys):
            if (j.job_id, i) not in tier.wait:
                # Not deferred: ok, unless the job's deadline or close came before its
                # item ran or settled (the clock and close race the engine's threads).
                late = {FailureReason.CLOSED} | (
                    {FailureReason.TIMEOUT} if j.deadline is not None else set())
                if (j.job_id, i) not in tier.runs:
                    assert r.failed.get(key) in late, (j.job_id, i, r.failed.get(key))
                else:
                    assert key in r.ok or r.failed.get(key) in late, (j.job_id, i)
            elif (j.job_id, i) not in won or won[(j.job_id, i)] == "lost":
                # the deadline or close came first
                assert r.failed.get(key) in (FailureReason.TIMEOUT, FailureReason.CLOSED)
            elif won[(j.job_id, i)] is None:  # succeed() won: the key is ok
                assert key in r.ok, (j.job_id, i, r.failed.get(key))
            else:
                assert r.failed.get(key) is FailureReason.IO
