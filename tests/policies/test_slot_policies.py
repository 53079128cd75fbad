"""The CPU pool's slot-indexed LRU, SIEVE and ARC (`LRUPolicy.for_slots`,
`SievePolicy.for_slots`, `ARCPolicy.for_slots`) behave exactly like the dict-based
policies: a differential
state machine drives both with the same calls and compares victims, `examined`,
exports and lookups after every step. Also: `GhostLists` against ordered dicts."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kvtiers.policies.arc import ARCPolicy
from kvtiers.policies.base import EvictionPolicy
from kvtiers.policies.ghosts import GhostLists
from kvtiers.policies.lru import LRUPolicy
from kvtiers.policies.sieve import SievePolicy
from kvtiers.policies.slot_arc import SlotARCPolicy
from kvtiers.policies.slot_lru import SlotLRUPolicy
from kvtiers.policies.slot_sieve import SlotSievePolicy

SLOTS = 8
KEYS = [f"k{i}".encode() for i in range(14)]


class SameAsReference(RuleBasedStateMachine):
    ref_cls: type[EvictionPolicy]

    def __init__(self) -> None:
        super().__init__()
        self.ref: Any = self.ref_cls(SLOTS)
        self.fast: Any = self.ref_cls.for_slots(SLOTS)
        assert type(self.fast) is not self.ref_cls
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
        assert self.fast.examined == self.ref.examined
        self.free.extend(slot for _, slot in got)

    @invariant()
    def same_state(self) -> None:
        assert len(self.fast) == len(self.ref)
        # Same victim order; pinned keys last (the slot policies keep no pin order).
        pinned = {k for k in KEYS if self.ref.is_pinned(k)}
        fast, ref = self.fast.export(), self.ref.export()
        assert fast[: len(fast) - len(pinned)] == ref[: len(ref) - len(pinned)]
        assert set(fast[len(fast) - len(pinned) :]) == pinned
        for key in KEYS:
            assert self.fast.get(key) == self.ref.get(key)
            assert self.fast.is_pinned(key) == self.ref.is_pinned(key)
            assert (key in self.fast) == (key in self.ref)
        if isinstance(self.ref, ARCPolicy):
            assert self.fast.p == self.ref.p
            for key in KEYS:  # ghosts: same remembered hashes, same lists
                h = hash(key)
                want = 1 if h in self.ref._b1 else 2 if h in self.ref._b2 else 0
                assert self.fast._ghosts.find(h) == want


class SameAsLRU(SameAsReference):
    ref_cls = LRUPolicy


class SameAsSieve(SameAsReference):
    ref_cls = SievePolicy


class SameAsARC(SameAsReference):
    ref_cls = ARCPolicy


TestSameAsLRU = SameAsLRU.TestCase
TestSameAsLRU.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestSameAsSieve = SameAsSieve.TestCase
TestSameAsSieve.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestSameAsARC = SameAsARC.TestCase
TestSameAsARC.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)


@pytest.mark.parametrize("cls", [SlotSievePolicy, SlotARCPolicy])
def test_long_random_run_matches_the_reference(cls: type[EvictionPolicy]) -> None:
    """Thousands of operations over a pool of 64 slots (ghost tables grow, rings
    compact, the dict index is rebuilt): the same victims all along."""
    ref_cls = SievePolicy if cls is SlotSievePolicy else ARCPolicy
    n = 64
    ref: Any = ref_cls(n)
    fast: Any = cls(n)
    rng = random.Random(7)
    keys = [rng.randbytes(12) for _ in range(400)]
    free = list(range(n))
    pinned: set[bytes] = set()
    for _ in range(30_000):
        key = rng.choice(keys)
        op = rng.random()
        if op < 0.5:
            if key in ref:
                ref.insert(key)
                fast.insert(key, 0)
            else:
                if not free:
                    got = fast.evict_items(rng.randint(1, 4))
                    assert got == ref.evict_items(len(got)) and fast.examined == ref.examined
                    free.extend(s for _, s in got)
                if free:
                    slot = free.pop()
                    ref.insert(key, slot)
                    fast.insert(key, slot)
        elif op < 0.75:
            ref.touch(key)
            fast.touch(key)
        elif op < 0.85:
            ref.pin(key)
            fast.pin(key)
            if key in ref:
                pinned.add(key)
        elif op < 0.95:
            ref.unpin(key)
            fast.unpin(key)
            pinned.discard(key)
        else:
            slot = ref.get(key)
            ref.remove(key)
            fast.remove(key)
            pinned.discard(key)
            if slot is not None:
                free.append(slot)
        assert len(fast) == len(ref)
    k = len(pinned)
    assert fast.export()[: len(ref) - k] == ref.export()[: len(ref) - k]


@pytest.mark.parametrize("cls", [SlotLRUPolicy, SlotSievePolicy, SlotARCPolicy])
def test_eviction_never_walks_pinned_entries(cls: type[EvictionPolicy]) -> None:
    n = 20_000
    policy: Any = cls(n)
    for slot in range(n):
        policy.insert(slot.to_bytes(4, "big"), slot)
    for slot in range(n * 9 // 10):  # the oldest 90% are pinned
        policy.pin(slot.to_bytes(4, "big"))
    before = policy.examined
    victims = policy.evict_items(100)
    assert len(victims) == 100
    assert policy.examined - before == 100
    assert all(slot >= n * 9 // 10 for _, slot in victims)


@pytest.mark.parametrize("cls", [SlotLRUPolicy, SlotSievePolicy, SlotARCPolicy])
def test_compaction_keeps_the_bound_get_working(cls: type[EvictionPolicy]) -> None:
    policy: Any = cls(64)
    get = policy.get
    for i in range(10_000):  # far past the compaction threshold
        if len(policy) == 64:
            ((_, slot),) = policy.evict_items(1)
        else:
            slot = len(policy)
        policy.insert(i.to_bytes(4, "big"), slot)
    assert get((9_999).to_bytes(4, "big")) is not None
    assert len(policy) == 64


@pytest.mark.parametrize("cls", [SlotLRUPolicy, SlotSievePolicy, SlotARCPolicy])
def test_values_must_be_slot_numbers(cls: type[EvictionPolicy]) -> None:
    policy = cls(4)
    with pytest.raises(ValueError, match="slot number"):
        policy.insert(b"a", 4)
    with pytest.raises(ValueError, match="slot number"):
        policy.insert(b"a", None)
    with pytest.raises(ValueError, match="capacity"):
        cls(None)
    with pytest.raises(NotImplementedError):
        policy.restore([b"a"])


def test_ghost_lists_match_ordered_dicts() -> None:
    """Random adds, hits and front drops against two ordered dicts (the structure
    ARCPolicy uses), through table growth and ring compaction."""
    ghosts = GhostLists()
    ref: tuple[OrderedDict[int, None], OrderedDict[int, None]] = (OrderedDict(), OrderedDict())
    rng = random.Random(3)
    pool = [rng.getrandbits(64) - (1 << 63) for _ in range(3000)] + [0, 1, -1]
    pool = [h for h in pool if h not in (0, 1)] + [5, 13, 21, 29]  # collide in small tables
    for _ in range(60_000):
        h = rng.choice(pool)
        op = rng.random()
        which = rng.choice((1, 2))
        if op < 0.5:
            if h not in ref[0] and h not in ref[1]:
                ref[which - 1][h] = None
            ghosts.add(which, h)
        elif op < 0.7:
            ref[0].pop(h, None)
            ref[1].pop(h, None)
            ghosts.discard(h)
        elif ref[which - 1]:
            ref[which - 1].popitem(last=False)
            ghosts.pop_oldest(which)
        else:
            ghosts.pop_oldest(which)  # empty: nothing happens
        assert (ghosts.len1, ghosts.len2) == (len(ref[0]), len(ref[1]))
    for h in pool:
        assert ghosts.find(h) == (1 if h in ref[0] else 2 if h in ref[1] else 0)
    assert len(ghosts) == len(ref[0]) + len(ref[1])
