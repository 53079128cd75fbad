"""`GatedPool`: tier threads wait at a closed gate, the test's thread never does, a
held thread gives up after `hold_s`, and failing slots raise on tier threads only."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from kvtiers.testing import GatedPool, fill_slots


def on_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run `fn` on a new thread; its return value or exception lands in the list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_gate_holds_tier_threads_until_released() -> None:
    pool = GatedPool(4, 4096)
    data = fill_slots(pool, [1])[0]  # the test's own thread is never held
    gate = pool.gate([1])
    thread, out = on_thread(lambda: bytes(pool.block(1)))
    gate.wait_entered(10)
    assert gate.held == 1 and out == [] and gate.entered_slots == {1}
    assert bytes(pool.block(1)) == data  # still not held: the test's thread
    gate.release()
    thread.join(10)
    assert out == [data] and gate.held == 0 and not gate.expired
    assert pool.accessed == {1}


def test_other_slots_pass_and_a_released_gate_stays_open() -> None:
    pool = GatedPool(4, 4096)
    with pool.gate([2]) as gate:
        thread, out = on_thread(lambda: len(pool.block(3)))
        thread.join(10)
        assert out == [4096] and not gate.entered
    thread, out = on_thread(lambda: len(pool.block(2)))
    thread.join(10)
    assert out == [4096]


def test_a_held_thread_gives_up_after_hold_s_and_says_so() -> None:
    pool = GatedPool(2, 4096, hold_s=0.05)
    gate = pool.gate([0])
    thread, out = on_thread(lambda: len(pool.block(0)))
    thread.join(10)
    assert out == [4096] and gate.expired


def test_wait_entered_fails_when_no_tier_thread_comes() -> None:
    pool = GatedPool(2, 4096)
    gate = pool.gate([0])
    pool.block(0)  # the test's thread: not held, does not count
    with pytest.raises(AssertionError, match="never reached slot"):
        gate.wait_entered(0.05, "a store")


def test_one_slot_is_behind_one_closed_gate_at_most() -> None:
    pool = GatedPool(4, 4096)
    first = pool.gate([0, 1])
    with pytest.raises(ValueError, match=r"\[1\]"):
        pool.gate([1, 2])
    first.release()
    pool.gate([1, 2])
    with pytest.raises(IndexError):
        pool.gate([4])


def test_failing_slots_raise_on_tier_threads_only_until_mended() -> None:
    pool = GatedPool(2, 4096)
    pool.fail([1])
    thread, out = on_thread(lambda: pool.block(1))
    thread.join(10)
    assert isinstance(out[0], OSError)
    assert len(pool.block(1)) == 4096  # the test's thread
    pool.mend()
    thread, out = on_thread(lambda: len(pool.block(1)))
    thread.join(10)
    assert out == [4096]


def test_release_all_opens_every_gate() -> None:
    pool = GatedPool(4, 4096)
    gates = [pool.gate([0]), pool.gate([1])]
    pool.fail([2])
    pool.release_all()
    assert all(g.is_open for g in gates)
    thread, out = on_thread(lambda: len(pool.block(2)))
    thread.join(10)
    assert out == [4096]
