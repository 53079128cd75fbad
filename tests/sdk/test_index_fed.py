"""`BoundedIndex` for a tier whose decisions come from shared storage (kvtiers-fs's
journal): queued mode (the scheduler's pin/touch/release never wait for the lock,
and an eviction still sees every pin queued before it), `adopt` (entries another
process committed: no eviction for them), `hold`/`release` (bytes of intents in
flight, evicting for them when asked), `order`, `size_of`."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kvtiers.policies import LRUPolicy
from kvtiers.sdk import BoundedIndex
from kvtiers.sdk.index import DRAIN_AT

KEYS = [bytes([i]) * 4 + b"\x00\x00\x00\x01" for i in range(8)]


def _index(capacity: int = 400, *, queued: bool = True,
           policy: Any = None) -> tuple[BoundedIndex[int], list[bytes]]:
    removed: list[bytes] = []
    policy = LRUPolicy() if policy is None else policy  # (an empty policy is falsy)
    return BoundedIndex(policy, capacity, on_removed=removed.extend, queued=queued), removed


class StuckExport(LRUPolicy):
    """`export` waits at a gate: whoever calls `order` holds the index lock meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.reached, self.gate = threading.Event(), threading.Event()
        self.armed = False

    def export(self) -> list[Any]:
        if self.armed:
            self.reached.set()
            assert self.gate.wait(30)
        return super().export()


@pytest.mark.parametrize("queued", [True, False])
def test_queued_calls_return_while_the_lock_is_held_for_long_work(queued: bool) -> None:
    """While another thread is inside `order` (a million-entry export, say), the
    scheduler's pin, touch and release return in queued mode - and only there."""
    policy = StuckExport()
    index, _ = _index(queued=queued, policy=policy)
    index.adopt([(k, 100, 100) for k in KEYS[:3]])
    policy.armed = True
    owner = threading.Thread(target=index.order, daemon=True)
    owner.start()
    assert policy.reached.wait(30)
    done = threading.Event()

    def scheduler() -> None:
        pins = index.pin(KEYS[:2])
        index.touch([KEYS[2]])
        pins.release()
        assert KEYS[0] in index and index.size_of(KEYS[0]) == 100
        done.set()

    threading.Thread(target=scheduler, daemon=True).start()
    returned = done.wait(0.5 if not queued else 30)
    policy.gate.set()
    owner.join(30)
    assert returned == queued
    done.wait(30)


def test_a_queued_pin_is_applied_before_any_eviction() -> None:
    index, removed = _index(300)
    index.adopt([(k, 100, 100) for k in KEYS[:3]])
    pins = index.pin([KEYS[0], KEYS[5]])  # KEYS[5] is absent: nothing to pin
    assert pins.locations == [100, None]
    assert index.queued == 1  # not applied yet ...
    got = index.hold(200)  # ... but before this eviction
    assert got == [(KEYS[1], 100), (KEYS[2], 100)] and removed == KEYS[1:3]
    assert index.hold(100) is None  # only the pinned entry is left
    assert index.view().entries[KEYS[0]].pins == 1
    pins.release()
    assert index.queued == 1 and index.apply_queued() == 1
    assert index.view().entries[KEYS[0]].pins == 0
    assert index.hold(100) == [(KEYS[0], 100)]


def test_a_long_queue_is_applied_by_the_scheduler_calls_when_the_lock_is_free() -> None:
    index, _ = _index()
    index.adopt([(KEYS[0], 100, 100)])
    for _ in range(DRAIN_AT + 1):
        index.pin([KEYS[0]]).release()
    assert index.queued < DRAIN_AT  # applied along the way, amortised O(1) a call
    assert index.view().entries[KEYS[0]].pins == 0


def test_adopt_never_evicts_and_leaves_present_entries_as_they_are() -> None:
    index, removed = _index(200)
    assert index.adopt([(k, 100, 100) for k in KEYS[:3]]) == 3  # past the capacity
    assert (index.committed_bytes, len(index), removed) == (300, 3, [])
    index.touch([KEYS[0]])
    assert index.adopt([(KEYS[0], 7, 7), (KEYS[3], 100, 100)]) == 1
    assert index.get(KEYS[0]) == 100 and index.size_of(KEYS[0]) == 100
    assert index.order() == [KEYS[1], KEYS[2], KEYS[0], KEYS[3]]  # adopted: newest
    # The next room made evicts down to the capacity first.
    assert index.hold(100) == [(KEYS[1], 100), (KEYS[2], 100), (KEYS[0], 100)]
    assert index.committed_bytes + index.reserved_bytes == 200


def test_hold_counts_bytes_with_or_without_making_room_and_release_gives_them_back() -> None:
    index, removed = _index(300)
    index.adopt([(k, 100, 100) for k in KEYS[:2]])
    assert index.hold(100, evict=False) == []  # another process's intent: it made room
    assert index.reserved_bytes == 100 and removed == []
    assert index.hold(400) is None and len(index) == 2  # more than the capacity
    assert index.hold(100) == [(KEYS[0], 100)] and removed == [KEYS[0]]
    assert index.view().used_bytes == 300
    index.release(200)
    assert index.reserved_bytes == 0
    with pytest.raises(ValueError, match="release of"):
        index.release(1)
    with pytest.raises(ValueError, match="size"):
        index.hold(-1)
    assert index.evictions == 1
