"""`SlotTable` on its own: slots, states, holds and evictions of the CPU pool."""

from __future__ import annotations

import pytest
from kvtiers.manager.event_log import EventLog
from kvtiers.manager.slot_state import DIRTY, FREE, LEAVING, PROMOTING, QUARANTINED, READY, STORING
from kvtiers.manager.slot_table import SlotTable
from kvtiers.policies.arc import ARCPolicy
from kvtiers.policies.lru import LRUPolicy
from kvtiers.policies.sieve import SievePolicy

from tests.manager.conftest import key

POLICIES = {"lru": LRUPolicy.for_slots, "arc": ARCPolicy.for_slots, "sieve": SievePolicy.for_slots}


def no_copy(key: bytes, slot: int) -> bool:
    raise AssertionError("copy_down called without write_back")


def table(n: int = 4, policy: str = "lru", write_back: bool = False) -> tuple[SlotTable, EventLog]:
    events = EventLog(enabled=True)
    return SlotTable(n, POLICIES[policy](n), events, write_back=write_back), events


def stored(t: SlotTable, *ids: int) -> list[int]:
    out = t.prepare_store([key(i) for i in ids], no_copy)
    assert out is not None
    assert t.finish_stores(out.keys, None) == out.keys
    return out.slots


def removed(events: EventLog) -> list[bytes]:
    return [k for e in events.take() if e.kind == "removed" for k in e.keys]


def test_a_store_goes_storing_then_ready_and_its_hold_goes() -> None:
    t, _ = table()
    out = t.prepare_store([key(1), key(2), key(1)], no_copy)
    assert out is not None and out.keys == [key(1), key(2)] and out.evicted == []
    assert [t.state[s] for s in out.slots] == [STORING, STORING]
    assert [t.holds[s] for s in out.slots] == [1, 1] and t.pinned == 2
    assert t.finish_stores([key(1)], None) == [key(1)]
    assert t.finish_stores([key(1)], None) == []  # not STORING any more: ignored
    t.fail_stores([key(2)])
    assert t.state[out.slots[0]] == READY and t.holds[out.slots[0]] == 0
    assert t.get(key(2)) is None and t.state[out.slots[1]] == FREE
    assert (len(t), t.pinned, t.free_count) == (1, 0, 3)


def test_holds_are_counted_and_pin_the_block() -> None:
    t, _ = table()
    (slot,) = stored(t, 1)
    assert t.hold_readable([key(1)]) == [slot]
    t.hold(key(1), slot)
    assert t.holds[slot] == 2 and t.policy.is_pinned(key(1)) and t.pinned == 1
    t.release_keys([key(1), key(9)])  # an unknown key is ignored
    assert t.policy.is_pinned(key(1))
    t.release(key(1), slot)
    assert not t.policy.is_pinned(key(1)) and t.pinned == 0
    with pytest.raises(AssertionError, match="below zero"):
        t.release(key(1), slot)


def test_hold_readable_is_all_or_nothing() -> None:
    t, _ = table()
    stored(t, 1, 2)
    t.prepare_store([key(3)], no_copy)  # STORING: not readable
    before = bytes(t.holds)
    for bad in ([key(1), key(2), key(3)], [key(1), key(9)]):
        with pytest.raises(KeyError, match="not readable"):
            t.hold_readable(bad)
        assert bytes(t.holds) == before


def test_the_views_are_read_only() -> None:
    t, _ = table()
    for view in (t.state, t.flags, t.holds):
        with pytest.raises(TypeError):
            view[0] = 1


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_prepare_store_never_evicts_a_block_of_the_call(policy: str) -> None:
    t, events = table(2, policy)
    stored(t, 1)
    stored(t, 2)
    t.touch([key(2)])  # key 1 is the best victim by every policy's measure
    out = t.prepare_store([key(1), key(5)], no_copy)
    assert out is not None and out.keys == [key(5)] and out.evicted == [key(2)]
    assert t.state[t.get(key(1))] == READY and t.holds[t.get(key(1))] == 0
    assert removed(events) == [key(2)]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_prepare_store_refuses_when_only_blocks_of_the_call_could_go(policy: str) -> None:
    t, events = table(2, policy)
    slots = stored(t, 1, 2)
    t.hold(key(2), slots[1])  # an engine load
    assert t.prepare_store([key(1), key(5)], no_copy) is None
    assert (t.get(key(1)), t.get(key(2))) == (slots[0], slots[1]) and removed(events) == []
    assert t.holds[slots[0]] == 0 and not t.policy.is_pinned(key(1))  # no hold left behind


def test_write_back_victims_are_copied_down_and_leave_on_their_last_hold() -> None:
    t, events = table(2, write_back=True)
    slots = stored(t, 1, 2)
    assert [t.flags[s] for s in slots] == [DIRTY, DIRTY]
    copies: list[tuple[bytes, int]] = []

    def copy_down(k: bytes, slot: int) -> bool:
        copies.append((k, slot))
        t.hold(k, slot)  # what a queued cascade takes
        return True

    assert t.prepare_store([key(3)], copy_down) is None  # the victim is still leaving
    assert copies == [(key(1), slots[0])] and t.flags[slots[0]] == LEAVING
    assert t.get(key(1)) == slots[0] and removed(events) == []  # still readable
    t.release(key(1), slots[0])  # its copy ended
    assert t.get(key(1)) is None and t.state[slots[0]] == FREE and t.flags[slots[0]] == 0
    assert removed(events) == [key(1)] and t.evictions == 1


def test_a_dirty_victim_no_tier_takes_is_dropped() -> None:
    t, events = table(1, write_back=True)
    stored(t, 1)
    out = t.prepare_store([key(2)], lambda k, s: False)
    assert out is not None and out.evicted == [key(1)] and removed(events) == [key(1)]


def test_a_promotion_reserves_evicts_lands_or_is_quarantined() -> None:
    t, events = table(2)
    stored(t, 1, 2)
    slot = t.reserve_promotion(key(7), no_copy)
    assert slot is not None and t.state[slot] == PROMOTING and t.holds[slot] == 1
    assert removed(events) == [key(1)]
    t.land(key(7), slot)
    assert t.state[slot] == READY and t.holds[slot] == 0
    slot8 = t.reserve_promotion(key(8), no_copy)
    assert slot8 is not None
    t.quarantine(key(8), slot8)
    assert t.get(key(8)) is None and t.state[slot8] == QUARANTINED and t.pinned == 0
    assert t.reserve_promotion(key(9), no_copy) is not None  # evicts key 7, not the quarantined
    assert t.free_count == 0 and t.reserve_promotion(key(10), no_copy) is None  # all held
    t.free_quarantined(slot8)
    assert t.state[slot8] == FREE and t.free_count == 1


def test_clear_drops_every_unheld_block_and_counts_no_eviction() -> None:
    t, events = table(4)
    slots = stored(t, 1, 2, 3)
    t.hold(key(2), slots[1])
    t.clear()
    assert [t.get(key(i)) for i in (1, 2, 3)] == [None, slots[1], None]
    assert sorted(removed(events)) == sorted([key(1), key(3)]) and t.evictions == 0
    assert t.free_count == 3


def test_held_pairs_are_released_by_their_slots() -> None:
    t, _ = table()
    slots = stored(t, 1, 2)
    held = t.hold_readable([key(2), key(1), key(2)])
    assert held == [slots[1], slots[0], slots[1]] and t.pinned == 2
    t.release_held([key(2), key(1)], [slots[1], slots[0]])
    assert t.pinned == 1  # key 2 still holds one
    t.release_held([key(2)], [slots[1]])
    assert t.pinned == 0
