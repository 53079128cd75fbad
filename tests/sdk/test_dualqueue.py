"""DualQueueThreadPool: loads ahead of stores, stealing, closing."""

from __future__ import annotations

import threading

from kvtiers.sdk.dualqueue import LOAD, STORE, DualQueueThreadPool
from kvtiers.testing import wait_until


class Gate:
    """A task that records when it ran and, if asked, waits for a gate."""

    def __init__(self, name: str, log: list[str], gate: threading.Event | None = None,
                 started: threading.Event | None = None):
        self.name, self.log, self.gate, self.started = name, log, gate, started
        self.cancelled = False

    def run(self) -> None:
        if self.started is not None:
            self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        self.log.append(self.name)

    def cancel(self) -> None:
        self.cancelled = True


def test_a_load_behind_a_thousand_stores_runs_next() -> None:
    pool = DualQueueThreadPool(1, 1, name="t")
    log: list[str] = []
    gates = [threading.Event(), threading.Event()]
    started = [threading.Event(), threading.Event()]
    try:
        # Both threads busy with a store each (the load thread stole one).
        pool.submit(STORE, [Gate("s-busy0", log, gates[0], started[0]),
                            Gate("s-busy1", log, gates[1], started[1])])
        assert started[0].wait(10) and started[1].wait(10)
        block = threading.Event()
        pool.submit(STORE, [Gate(f"s{i}", log, block) for i in range(1000)])
        pool.submit(LOAD, [Gate("load", log)])
        gates[0].set()
        gates[1].set()
        wait_until(lambda: "load" in log, "the load ran")
        # The load ran right after the busy stores: not one queued store before it.
        assert log.index("load") <= 2 and not any(n.startswith("s") and n[1:].isdigit()
                                                  for n in log[: log.index("load")])
        block.set()
        wait_until(lambda: len(log) == 1003, "everything ran")
    finally:
        block.set()
        pool.close()


def test_idle_threads_take_the_other_kind_of_work() -> None:
    pool = DualQueueThreadPool(2, 1, name="t")
    log: list[str] = []
    try:
        pool.submit(STORE, [Gate(f"s{i}", log) for i in range(200)])
        pool.submit(LOAD, [Gate(f"l{i}", log) for i in range(200)])
        wait_until(lambda: len(log) == 400, "all tasks ran")
    finally:
        pool.close()
    # Queues are FIFO per kind.
    stores = [int(n[1:]) for n in log if n[0] == "s"]
    assert sorted(stores) == list(range(200))
    assert pool.ran[(LOAD, LOAD)] + pool.ran[(STORE, LOAD)] == 200
    assert pool.ran[(LOAD, STORE)] + pool.ran[(STORE, STORE)] == 200


def test_load_threads_run_stores_when_no_load_waits() -> None:
    pool = DualQueueThreadPool(3, 1, name="t")
    gate = threading.Event()
    log: list[str] = []
    started = [threading.Event() for _ in range(4)]
    try:
        pool.submit(STORE, [Gate(f"s{i}", log, gate, started[i]) for i in range(4)])
        for ev in started:  # four stores at once: all four threads on stores
            assert ev.wait(10), "an idle load thread did not take a store"
    finally:
        gate.set()
        pool.close()
    assert pool.ran[(LOAD, STORE)] == 3


def test_close_hands_back_queued_tasks_and_refuses_new_ones() -> None:
    pool = DualQueueThreadPool(1, 1, name="t")
    gate = threading.Event()
    started = threading.Event(), threading.Event()
    log: list[str] = []
    pool.submit(STORE, [Gate("a", log, gate, started[0]), Gate("b", log, gate, started[1])])
    assert started[0].wait(10) and started[1].wait(10)
    queued = [Gate(f"q{i}", log) for i in range(5)]
    pool.submit(LOAD, queued[:2])
    pool.submit(STORE, queued[2:])
    threading.Timer(0.05, gate.set).start()
    left = pool.close()
    assert left == queued  # loads first, then stores, each in order
    assert sorted(log) == ["a", "b"]  # running tasks finished
    assert pool.submit(LOAD, [Gate("late", log)]) is False
    assert pool.close() == []


def test_first_puts_tasks_at_the_head_in_their_order() -> None:
    pool = DualQueueThreadPool(1, 1, name="t")
    log: list[str] = []
    held, gate = threading.Event(), threading.Event()
    started = [threading.Event(), threading.Event()]
    try:
        # One thread held to the end, the other until everything below is queued:
        # then one thread runs the queue, in its order.
        pool.submit(STORE, [Gate("held", log, held, started[0]),
                            Gate("busy", log, gate, started[1])])
        assert started[0].wait(10) and started[1].wait(10)
        pool.submit(STORE, [Gate(f"job{i}", log) for i in range(3)])
        pool.submit(STORE, [Gate("w0", log), Gate("w1", log)], first=True)
        gate.set()
        wait_until(lambda: len(log) == 6, "the queue ran")
        assert log == ["busy", "w0", "w1", "job0", "job1", "job2"]
    finally:
        held.set()
        gate.set()
        pool.close()
