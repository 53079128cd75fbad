"""SlotLRUPolicy (the CPU pool's LRU over slot numbers) behaves exactly like
LRUPolicy: a differential state machine drives both with the same calls."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kvtiers.policies.lru import LRUPolicy
from kvtiers.policies.slot_lru import SlotLRUPolicy

SLOTS = 8
KEYS = [f"k{i}".encode() for i in range(12)]


class SameAsLRU(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ref = LRUPolicy()
        self.fast = LRUPolicy.for_slots(SLOTS)
        self.free = list(range(SLOTS))

    @rule(key=st.sampled_from(KEYS))
    def insert(self, key: bytes) -> None:
        if key in self.ref:
            self.ref.insert(key, None)
            self.fast.insert(key, 0)  # present: a use, the value is ignored
        elif self.free:
            slot = self.free.pop()
            self.ref.insert(key, slot)
            self.fast.insert(key, slot)

    @rule(key=st.sampled_from(KEYS))
    def touch(self, key: bytes) -> None:
        self.ref.touch(key)
        self.fast.touch(key)

    @rule(key=st.sampled_from(KEYS))
    def pin(self, key: bytes) -> None:
        self.ref.pin(key)
        self.fast.pin(key)

    @rule(key=st.sampled_from(KEYS))
    def unpin(self, key: bytes) -> None:
        self.ref.unpin(key)
        self.fast.unpin(key)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: bytes) -> None:
        slot = self.ref.get(key)
        self.ref.remove(key)
        self.fast.remove(key)
        if slot is not None:
            self.free.append(slot)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=5))
    def touch_many(self, keys: list[bytes]) -> None:
        for key in keys:
            self.ref.touch(key)
        self.fast.touch_many(keys)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=5))
    def pin_many(self, keys: list[bytes]) -> None:
        for key in keys:
            self.ref.pin(key)
        self.fast.pin_many(keys)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=5))
    def unpin_many(self, keys: list[bytes]) -> None:
        for key in keys:
            self.ref.unpin(key)
        self.fast.unpin_many(iter(keys))

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=4))
    def insert_pinned(self, keys: list[bytes]) -> None:
        """As the pool stores: absent keys with free slots, pinned at once (a key
        twice in the call, or present, is a use and a pin)."""
        slots: list[int] = []
        for key in keys:
            if key in self.ref or key in keys[: len(slots)]:
                slots.append(0)
            elif self.free:
                slots.append(self.free.pop())
            else:
                break
        keys = keys[: len(slots)]
        for key, slot in zip(keys, slots, strict=True):
            self.ref.insert(key, slot)
            self.ref.pin(key)
        self.fast.insert_pinned(keys, slots)

    @rule(n=st.integers(0, 5))
    def evict(self, n: int) -> None:
        got = self.fast.evict_items(n)
        assert got == self.ref.evict_items(n)
        self.free.extend(slot for _, slot in got)

    @invariant()
    def same_state(self) -> None:
        assert len(self.fast) == len(self.ref)
        # Unpinned entries in the same order; pinned ones (SlotLRU keeps no pin order).
        pinned = {k for k in KEYS if self.ref.is_pinned(k)}
        fast, ref = self.fast.export(), self.ref.export()
        assert fast[: len(fast) - len(pinned)] == ref[: len(ref) - len(pinned)]
        assert set(fast[len(fast) - len(pinned) :]) == pinned
        for key in KEYS:
            assert self.fast.get(key) == self.ref.get(key)
            assert self.fast.is_pinned(key) == self.ref.is_pinned(key)
            assert (key in self.fast) == (key in self.ref)


TestSameAsLRU = SameAsLRU.TestCase
TestSameAsLRU.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_eviction_never_walks_pinned_entries() -> None:
    n = 20_000
    policy = SlotLRUPolicy(n)
    for slot in range(n):
        policy.insert(slot.to_bytes(4, "big"), slot)
    for slot in range(n * 9 // 10):  # the oldest 90% are pinned
        policy.pin(slot.to_bytes(4, "big"))
    before = policy.examined
    victims = policy.evict_items(100)
    assert len(victims) == 100
    assert policy.examined - before == 100
    assert all(slot >= n * 9 // 10 for _, slot in victims)


def test_compaction_keeps_the_bound_get_working() -> None:
    policy = SlotLRUPolicy(64)
    get = policy.get
    for i in range(10_000):  # far past the compaction threshold
        if len(policy) == 64:
            (key, slot), = policy.evict_items(1)
        else:
            slot = len(policy)
        policy.insert(i.to_bytes(4, "big"), slot)
    assert get((9_999).to_bytes(4, "big")) is not None
    assert len(policy) == 64


def test_values_must_be_slot_numbers() -> None:
    policy = SlotLRUPolicy(4)
    with pytest.raises(ValueError, match="slot number"):
        policy.insert(b"a", 4)
    with pytest.raises(ValueError, match="slot number"):
        policy.insert(b"a", None)
