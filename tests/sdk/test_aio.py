"""`AsyncJobEngine`: the same promises as the thread engine - exactly once, deadlines,
`closed`, crashes cost `io`, hook order, batching, loads ahead of stores, stealing -
with coroutine items on the engine's own loop; plus cancellation at close, `run`
and `on_close`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from kvtiers import FailureReason, JobResult, TransferJob
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.stats import StatsRecorder
from kvtiers.contract.tier import TierContext
from kvtiers.sdk import LOAD, STORE, AsyncJobEngine, AsyncJobHooks, Job, Outcome
from kvtiers.testing import make_context, random_keys, wait_until

BB = 16384


class Gate:
    """Opened from any thread, awaited on the engine's loop."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self.entered = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._lock = threading.Lock()

    def open(self) -> None:
        with self._lock:
            self._open.set()
            waiters, self._waiters = self._waiters, []
            for loop, ev in waiters:
                if not loop.is_closed():  # else the item was cancelled at close
                    loop.call_soon_threadsafe(ev.set)

    async def wait(self) -> None:
        self.entered.set()
        ev = asyncio.Event()
        with self._lock:
            if self._open.is_set():
                return
            self._waiters.append((asyncio.get_running_loop(), ev))
        await ev.wait()


@dataclass
class Script:
    log: list[tuple[str, int, Any]] = field(default_factory=list)
    gates: dict[int, Gate] = field(default_factory=dict)
    crash: set[tuple[int, int]] = field(default_factory=set)
    fail: dict[tuple[int, int], FailureReason] = field(default_factory=dict)
    running: dict[int, int] = field(default_factory=dict)
    on_item: Callable[[Job, int], object] | None = None
    start_override: Callable[[Job], list[int]] | None = None
    end_extra: Callable[[Job], object] | None = None
    stubborn: bool = False  # items swallow one cancellation

    def gate(self, job_id: int) -> Gate:
        self.gates[job_id] = Gate()
        return self.gates[job_id]

    async def block(self, job: Job, i: int) -> Outcome:
        self.running[job.job_id] = self.running.get(job.job_id, 0) + 1
        self.log.append(("item", job.job_id, i))
        try:
            await asyncio.sleep(0)  # a real suspension point between items
            if job.job_id in self.gates:
                await self.gates[job.job_id].wait()
            if self.on_item is not None:
                self.on_item(job, i)
            if (job.job_id, i) in self.crash:
                raise RuntimeError(f"boom in {job.job_id}/{i}")
            return self.fail.get((job.job_id, i))
        finally:
            self.running[job.job_id] -= 1

    async def batch(self, job: Job, indices: Sequence[int]) -> list[Outcome]:
        self.log.append(("batch", job.job_id, tuple(indices)))
        await asyncio.sleep(0)
        if (job.job_id, -1) in self.crash:
            raise RuntimeError("batch boom")
        return [self.fail.get((job.job_id, i)) for i in indices]

    def start(self, job: Job) -> list[int]:
        if self.start_override is not None:
            return self.start_override(job)
        self.log.append(("start", job.job_id, None))
        if (job.job_id, -2) in self.crash:
            raise RuntimeError("start boom")
        for i in range(1, len(job.keys), 2):
            job.succeed(i)
        return list(range(0, len(job.keys), 2))

    def end(self, job: Job) -> None:
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


Engines = Callable[..., AsyncJobEngine]


@pytest.fixture
def engines(ctx: TierContext) -> Iterator[Engines]:
    made: list[tuple[AsyncJobEngine, Script]] = []

    def make(script: Script, *, store_start: bool = True, batch: bool = False,
             **kwargs: Any) -> AsyncJobEngine:
        batch_fn = script.batch if batch else None
        engine = AsyncJobEngine(
            ctx, load=AsyncJobHooks(script.block, batch_fn, None, script.end),
            store=AsyncJobHooks(script.block, batch_fn, script.start if store_start else None,
                                script.end), **kwargs)
        made.append((engine, script))
        return engine

    yield make
    for engine, script in made:
        for gate in script.gates.values():
            gate.open()
        engine.close(30)


def job(job_id: int, n: int = 1, deadline: float | None = None) -> TransferJob:
    return TransferJob(job_id, random_keys(n), list(range(n)), deadline)


def collect(engine: AsyncJobEngine, ids: Sequence[int]) -> dict[int, JobResult]:
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


def test_a_store_runs_start_items_end_then_reports(engines: Engines) -> None:
    script = Script()
    stats = StatsRecorder()
    engine = engines(script, stats=stats)
    j = job(1, 5)
    engine.submit_store(j, state="mine")
    result = collect(engine, [1])[1]
    assert result.ok == list(j.keys) and result.bytes_moved == 3 * BB
    events = script.events(1)
    assert events[0] == "start" and events[-1] == "end" and events.count("item") == 3
    assert ("end", 1, "mine") in script.log
    assert stats.snapshot(0).blocks_written == 5


def test_batches_of_consecutive_items(engines: Engines) -> None:
    script = Script()
    engine = engines(script, batch=True, batch_bytes=4 * BB)
    script.fail[(1, 6)] = FailureReason.MISSING
    j = job(1, 7)
    engine.submit_load(j)
    result = collect(engine, [1])[1]
    assert sorted(i for k, _, i in script.log if k == "batch") == [(0, 1, 2, 3), (4, 5, 6)]
    assert result.failed == {j.keys[6]: FailureReason.MISSING}


def test_items_taken_after_the_deadline_run_no_tier_code(
    engines: Engines, clock: ManualClock
) -> None:
    script = Script()
    engine = engines(script, load_concurrency=1, store_concurrency=0)
    gate = script.gate(1)
    engine.submit_load(job(1))
    assert gate.entered.wait(30)
    engine.submit_store(job(2, 3, deadline=clock() + 5))
    engine.submit_load(job(3, 2, deadline=clock() + 5))
    clock.advance(10)
    gate.open()
    results = collect(engine, [1, 2, 3])
    assert results[1].success
    assert reasons(results[2]) == reasons(results[3]) == {FailureReason.TIMEOUT}
    assert script.events(2) == ["end"] and script.events(3) == ["end"]


def test_the_deadline_passing_mid_unit_stops_the_rest(
    engines: Engines, clock: ManualClock
) -> None:
    script = Script()
    engine = engines(script, batch_bytes=8 * BB)  # one unit, items in turn
    script.on_item = lambda j, i: clock.advance(10) if i == 0 else None
    j = job(1, 3, deadline=clock() + 5)
    engine.submit_load(j)
    result = collect(engine, [1])[1]
    assert result.ok == [j.keys[0]]
    assert result.failed == dict.fromkeys(j.keys[1:], FailureReason.TIMEOUT)


def test_close_fails_queued_jobs_waits_for_running_ones(engines: Engines) -> None:
    script = Script()
    on_close = threading.Event()

    async def closing() -> None:
        on_close.set()

    engine = engines(script, load_concurrency=1, store_concurrency=0, on_close=closing)
    gate = script.gate(1)
    engine.submit_store(job(1, 2), state="s1")
    assert gate.entered.wait(30)
    engine.submit_load(job(2, 3), state="pins")
    engine.submit_store(job(3, 2), state="s3")
    done: list[bool] = []
    closer = threading.Thread(target=lambda: done.append(engine.close()))
    closer.start()
    wait_until(lambda: ("end", 2, "pins") in script.log, "the queued load ended")
    assert not on_close.is_set()  # the running item has not finished yet
    gate.open()
    closer.join(30)
    assert done == [True] and on_close.is_set()
    engine.submit_load(job(4), state="late")
    results = collect(engine, [1, 2, 3, 4])
    assert results[1].success
    for i in (2, 3, 4):
        assert reasons(results[i]) == {FailureReason.CLOSED}
    assert sorted(j for k, j, _ in script.log if k == "end") == [1, 2, 3, 4]
    assert engine.pending == 0 and engine.close() is True


def test_close_cancels_items_still_running_after_its_timeout(engines: Engines) -> None:
    script = Script()
    engine = engines(script)
    gate = script.gate(1)  # never opened before close
    j = job(1, 2)
    engine.submit_load(j)
    assert gate.entered.wait(30)
    assert engine.close(timeout=0.05) is False
    result = collect(engine, [1])[1]
    assert reasons(result) == {FailureReason.CLOSED}
    assert script.events(1)[-1] == "end"


def test_every_job_is_reported_once_when_close_races_submits(engines: Engines) -> None:
    script = Script()
    engine = engines(script, load_concurrency=2, store_concurrency=2, batch_bytes=2 * BB)
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

    threads = [threading.Thread(target=submitter, args=(b,)) for b in (0, 10_000)]
    for t in threads:
        t.start()
    go.set()
    wait_until(lambda: len(submitted) >= 100, "some jobs submitted")
    engine.close()
    stop.set()
    for t in threads:
        t.join(30)
    results = collect(engine, [j.job_id for j in submitted])
    for j in submitted:
        r = results[j.job_id]
        assert set(r.ok) | set(r.failed) == set(j.keys) and not set(r.ok) & set(r.failed)
        assert reasons(r) <= {FailureReason.CLOSED}
    assert engine.pending == 0


def test_crashes_cost_io_and_the_loop_lives_on(
    engines: Engines, caplog: pytest.LogCaptureFixture
) -> None:
    script = Script()
    crashes: list[BaseException] = []
    engine = engines(script, on_crash=crashes.append, batch=True, batch_bytes=2 * BB)
    script.crash |= {(2, -1), (3, -2), (4, -3)}
    engine.submit_load(job(2, 2))  # batch raises
    engine.submit_store(job(3, 3))  # start raises
    engine.submit_store(job(4, 2))  # end raises
    results = collect(engine, [2, 3, 4])
    for i in (2, 3, 4):
        assert reasons(results[i]) == {FailureReason.IO} and results[i].ok == []
    assert len(crashes) == 3 and "batch boom" in caplog.text
    engine.submit_load(job(5, 2))
    assert collect(engine, [5])[5].success


def test_an_item_that_raises_fails_only_its_key(engines: Engines) -> None:
    script = Script()
    engine = engines(script)
    script.crash.add((1, 1))
    j = job(1, 3)
    engine.submit_load(j)
    assert collect(engine, [1])[1].failed == {j.keys[1]: FailureReason.IO}


def test_loads_run_before_queued_stores(engines: Engines) -> None:
    script = Script()
    engine = engines(script, store_start=False, load_concurrency=1, store_concurrency=0)
    gate = script.gate(1)
    engine.submit_store(job(1))
    assert gate.entered.wait(30)
    engine.submit_store(job(2))
    engine.submit_load(job(3))
    gate.open()
    collect(engine, [1, 2, 3])
    assert [j for k, j, _ in script.log if k == "item"] == [1, 3, 2]


def test_a_free_load_place_takes_store_work(engines: Engines) -> None:
    script = Script()
    engine = engines(script, store_start=False, load_concurrency=1, store_concurrency=1)
    gate = script.gate(1)
    engine.submit_store(job(1, 2))  # two units: both places on stores
    wait_until(lambda: script.running.get(1) == 2, "both items running")
    gate.open()
    collect(engine, [1])
    assert engine.ran[(LOAD, STORE)] == 1 and engine.ran[(STORE, STORE)] == 1


def test_concurrency_is_bounded(engines: Engines) -> None:
    script = Script()
    engine = engines(script, load_concurrency=3, store_concurrency=0)
    gate = script.gate(1)
    peak = 0

    def watch(j: Job, i: int) -> None:
        nonlocal peak
        peak = max(peak, script.running[1])

    script.on_item = watch
    engine.submit_load(job(1, 10))
    wait_until(lambda: script.running.get(1) == 3, "three items running")
    gate.open()
    assert collect(engine, [1])[1].success
    assert peak == 3


def test_run_executes_on_the_loop_and_refuses_after_close(engines: Engines) -> None:
    engine = engines(Script())

    async def where() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert engine.run(where(), timeout=30) is engine.loop
    engine.close()
    with pytest.raises(RuntimeError, match="after close"):
        engine.run(where())


def test_concurrency_is_checked(ctx: TierContext) -> None:
    hooks = AsyncJobHooks(block=Script().block)
    with pytest.raises(ValueError, match="concurrency"):
        AsyncJobEngine(ctx, load=hooks, store=hooks, load_concurrency=0, store_concurrency=0)


def test_kinds_are_reported_to_stats(engines: Engines) -> None:
    stats = StatsRecorder()
    engine = engines(Script(), stats=stats, store_start=False)
    engine.submit_store(job(1, 2))
    engine.submit_load(job(2, 3))
    engine.submit_load(TransferJob(3, [], []))
    collect(engine, [1, 2, 3])
    snap = stats.snapshot(0)
    assert (snap.blocks_written, snap.blocks_read) == (2, 3)
    assert STORE == "store"


def test_run_off_loop_cancelled_while_its_function_raises_leaves_nothing_unread() -> None:
    """Cancelled mid-call, `run_off_loop` waits for the thread and reads how it ended:
    a function that raised meanwhile is not reported as 'exception never retrieved'."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    from kvtiers.sdk import run_off_loop

    started, release = threading.Event(), threading.Event()

    def copy() -> None:
        started.set()
        release.wait(5)
        raise OSError("copy failed")

    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: reported.append(ctx))
        with ThreadPoolExecutor(1) as pool:
            task = asyncio.create_task(run_off_loop(pool, copy))
            await asyncio.to_thread(started.wait, 5)
            task.cancel()
            await asyncio.sleep(0.05)
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
        del task
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    assert reported == []
