"""In-place pins (`EvictionPolicy.keep_pinned_in_place`) of the CPU pool's LRU and
ARC: a pinned entry keeps its place and unpinning does not refresh it; touches
move pinned entries; an entry eviction passed over while pinned comes back as the
oldest; an insertion is not a use (ARC: a remembered key enters T1); `reorder_many`
counts only its `used` keys as uses.

The slot policies are driven side by side with reference models written from those
rules (plain lists), on the C path and the pure-Python one: same victims, same
`examined`, same order, same ARC target and ghosts after every step."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.manager.manager import TieringOffloadingManager
from kvtiers.policies.arc import ARCPolicy
from kvtiers.policies.lru import LRUPolicy
from kvtiers.policies.sieve import SievePolicy
from kvtiers.policies.slot_arc import SlotARCPolicy
from kvtiers.policies.slot_lru import SlotLRUPolicy

from tests.policies.test_slot_policies import PATHS, build

SLOTS = 8
KEYS = [f"k{i}".encode() for i in range(14)]


def in_place(cls: type[EvictionPolicy], slots: int = SLOTS, use_native: bool = True) -> Any:
    policy: Any = build(lambda: cls.for_slots(slots), use_native)
    assert policy.keep_pinned_in_place()
    assert policy.pinned_in_place
    return policy


class InPlaceModel:
    """LRU (one side) or ARC (two sides) with in-place pins, from the rules alone:
    per side a front list and a main list, oldest first; pinned and passed sets."""

    def __init__(self, arc: bool, capacity: int) -> None:
        self.arc = arc
        self.c = capacity
        self.lists: dict[int, tuple[list[bytes], list[bytes]]] = {1: ([], []), 2: ([], [])}
        self.side: dict[bytes, int] = {}
        self.values: dict[bytes, int] = {}
        self.pinned: set[bytes] = set()
        self.passed: set[bytes] = set()
        self.p = 0.0
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.examined = 0

    def _count(self, side: int, pinned: bool) -> int:
        return sum(1 for k, s in self.side.items() if s == side and (k in self.pinned) == pinned)

    def _unlink(self, key: bytes) -> None:
        if key in self.passed:
            self.passed.discard(key)
            return
        for lst in self.lists[self.side[key]]:
            if key in lst:
                lst.remove(key)

    def insert(self, key: bytes, value: int, pinned: bool = False) -> None:
        if key in self.values:
            self.touch(key)
            if pinned:
                self.pin(key)
            return
        h = hash(key)
        found = 1 if h in self.b1 else 2 if h in self.b2 else 0
        if found == 1:
            self.p = min(self.c, self.p + max(1.0, len(self.b2) / len(self.b1)))
            del self.b1[h]
        elif found == 2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
            del self.b2[h]
        self.values[key] = value
        self.side[key] = 1
        self.lists[1][1].append(key)
        if pinned:
            self.pinned.add(key)
        t1 = self._count(1, False) + self._count(1, True)
        if self.arc and not found and self.b1 and t1 + len(self.b1) > self.c:
            self.b1.popitem(last=False)

    def move(self, key: bytes, used: bool) -> None:
        if key not in self.values:
            return
        self._unlink(key)
        if used and self.arc:
            self.side[key] = 2
        self.lists[self.side[key]][1].append(key)

    def touch(self, key: bytes) -> None:
        self.move(key, used=True)

    def pin(self, key: bytes) -> None:
        if key in self.values:
            self.pinned.add(key)

    def unpin(self, key: bytes) -> None:
        if key not in self.pinned:
            return
        self.pinned.discard(key)
        if key in self.passed:
            self.passed.discard(key)
            self.lists[self.side[key]][0].append(key)

    def remove(self, key: bytes) -> None:
        if key not in self.values:
            return
        self._unlink(key)
        self.pinned.discard(key)
        del self.values[key], self.side[key]

    def _take(self, key: bytes, side: int, victims: list[tuple[bytes, int]]) -> None:
        victims.append((key, self.values.pop(key)))
        del self.side[key]
        (self.b1 if side == 1 else self.b2)[hash(key)] = None

    def evict(self, n: int) -> list[tuple[bytes, int]]:
        victims: list[tuple[bytes, int]] = []
        if not self.arc:  # LRU walks its lists, oldest first, until n victims
            for lst in self.lists[1]:
                while lst and len(victims) < n:
                    key = lst.pop(0)
                    if key in self.pinned:
                        self.passed.add(key)
                        self.examined += 1
                    else:
                        self._take(key, 1, victims)
            self.examined += len(victims)
            return victims
        while len(victims) < n:
            n1, n2 = self._count(1, False), self._count(2, False)
            if n1 and (n1 + self._count(1, True) > self.p or not n2):
                side = 1
            elif n2:
                side = 2
            else:
                break
            victim = None
            for lst in self.lists[side]:
                while lst and victim is None:
                    key = lst.pop(0)
                    if key in self.pinned:
                        self.passed.add(key)
                        self.examined += 1
                    else:
                        victim = key
                if victim is not None:
                    break
            assert victim is not None
            self._take(victim, side, victims)
        self.examined += len(victims)
        if self.arc:
            while self.b1 and self._count(1, False) + self._count(1, True) + len(self.b1) > self.c:
                self.b1.popitem(last=False)
            while len(self.b1) + len(self.b2) > self.c:
                (self.b2 or self.b1).popitem(last=False)
        return victims

    def export(self) -> list[bytes]:
        """Unpinned keys in the order `export` gives, then the pinned ones."""
        unpinned = [[k for lst in self.lists[s] for k in lst if k not in self.pinned]
                    for s in (1, 2)]  # fmt: skip
        t1, t2 = unpinned
        first = len(t1)
        if self.arc and t2:
            first = max(0, math.ceil(len(t1) + self._count(1, True) - self.p))
        return [*t1[:first], *t2, *t1[first:]]


class SameAsModel(RuleBasedStateMachine):
    cls: type[EvictionPolicy] = SlotLRUPolicy
    use_native = True

    def __init__(self) -> None:
        super().__init__()
        self.fast = in_place(self.cls, SLOTS, self.use_native)
        self.model = InPlaceModel(self.cls is SlotARCPolicy, SLOTS)
        self.free = list(range(SLOTS))

    @rule(key=st.sampled_from(KEYS))
    def insert(self, key: bytes) -> None:
        if key in self.model.values:
            self.model.insert(key, 0)
            self.fast.insert(key, 0)
        elif self.free:
            slot = self.free.pop()
            self.model.insert(key, slot)
            self.fast.insert(key, slot)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=4))
    def insert_pinned(self, keys: list[bytes]) -> None:
        """As the pool stores: absent keys with free slots, pinned at once (a key
        twice in the call, or present, is a use and a pin)."""
        slots: list[int] = []
        for key in keys:
            if key in self.model.values or key in keys[: len(slots)]:
                slots.append(0)
            elif self.free:
                slots.append(self.free.pop())
            else:
                break
        keys = keys[: len(slots)]
        for key, slot in zip(keys, slots, strict=True):
            self.model.insert(key, slot, pinned=True)
        self.fast.insert_pinned(keys, slots)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=5), batch=st.booleans())
    def touch(self, keys: list[bytes], batch: bool) -> None:
        for key in keys:
            self.model.touch(key)
        if batch:
            self.fast.touch_many(keys)
        else:
            for key in keys:
                self.fast.touch(key)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=5), batch=st.booleans())
    def pin(self, keys: list[bytes], batch: bool) -> None:
        for key in keys:
            self.model.pin(key)
        if batch:
            self.fast.pin_many(keys)
        else:
            for key in keys:
                self.fast.pin(key)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=5), batch=st.booleans())
    def unpin(self, keys: list[bytes], batch: bool) -> None:
        for key in keys:
            self.model.unpin(key)
        if batch:
            self.fast.unpin_many(keys)
        else:
            for key in keys:
                self.fast.unpin(key)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=6), used=st.sets(st.sampled_from(KEYS)))
    def reorder(self, keys: list[bytes], used: set[bytes]) -> None:
        for key in keys:
            self.model.move(key, key in used)
        self.fast.reorder_many(keys, used)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: bytes) -> None:
        slot = self.model.values.get(key)
        self.model.remove(key)
        self.fast.remove(key)
        if slot is not None:
            self.free.append(slot)

    @rule(n=st.integers(0, 5))
    def evict(self, n: int) -> None:
        got = self.fast.evict_items(n)
        assert got == self.model.evict(n)
        assert self.fast.examined == self.model.examined
        self.free.extend(slot for _, slot in got)

    @invariant()
    def same_state(self) -> None:
        model = self.model
        assert len(self.fast) == len(model.values)
        order = model.export()
        exported = self.fast.export()
        assert exported[: len(order)] == order
        assert set(exported[len(order) :]) == model.pinned
        for key in KEYS:
            assert self.fast.get(key) == model.values.get(key)
            assert self.fast.is_pinned(key) == (key in model.pinned)
        if model.arc:
            assert self.fast.p == model.p
            for key in KEYS:
                h = hash(key)
                want = 1 if h in model.b1 else 2 if h in model.b2 else 0
                assert self.fast._ghosts.find(h) == want


class SameAsModelARC(SameAsModel):
    cls = SlotARCPolicy


class SameAsModelPython(SameAsModel):
    use_native = False


class SameAsModelARCPython(SameAsModelARC):
    use_native = False


_SETTINGS = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestSameAsModel = SameAsModel.TestCase
TestSameAsModel.settings = _SETTINGS
TestSameAsModelARC = SameAsModelARC.TestCase
TestSameAsModelARC.settings = _SETTINGS
TestSameAsModelPython = SameAsModelPython.TestCase
TestSameAsModelPython.settings = _SETTINGS
TestSameAsModelARCPython = SameAsModelARCPython.TestCase
TestSameAsModelARCPython.settings = _SETTINGS


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("cls", [SlotLRUPolicy, SlotARCPolicy])
def test_a_pin_keeps_the_place(cls: type[EvictionPolicy], use_native: bool) -> None:
    """a, b, c inserted; a pinned then unpinned (a transfer ran): a is still the
    oldest, where the default mode makes it the newest."""
    for keep in (True, False):
        policy: Any = build(lambda: cls.for_slots(SLOTS), use_native)
        if keep:
            policy.keep_pinned_in_place()
        for slot, key in enumerate(KEYS[:3]):
            policy.insert(key, slot)
        policy.pin(KEYS[0])
        policy.unpin(KEYS[0])
        assert policy.evict(1) == [KEYS[0] if keep else KEYS[1]]


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("cls", [SlotLRUPolicy, SlotARCPolicy])
def test_a_passed_entry_comes_back_as_the_oldest(
    cls: type[EvictionPolicy], use_native: bool
) -> None:
    policy = in_place(cls, SLOTS, use_native)
    a, b, c, d = KEYS[:4]
    policy.insert_pinned([a], [0])
    policy.insert(b, 1)
    policy.insert(c, 2)
    assert policy.evict(1) == [b]  # a, pinned, passed over
    assert policy.examined == 2
    policy.insert(d, 3)
    policy.unpin(a)
    assert policy.evict(3) == [a, c, d]
    assert len(policy) == 0


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("cls", [SlotLRUPolicy, SlotARCPolicy])
def test_touching_a_pinned_entry_moves_it(cls: type[EvictionPolicy], use_native: bool) -> None:
    policy = in_place(cls, SLOTS, use_native)
    a, b = KEYS[:2]
    policy.insert_pinned([a, b], [0, 1])
    policy.touch_many([a])
    policy.unpin_many([a, b])
    assert policy.evict(2) == [b, a]


@pytest.mark.parametrize("use_native", PATHS)
def test_arc_insertion_is_not_a_use(use_native: bool) -> None:
    """A key B1 remembers comes back: `p` grows as ARC's does, but the key enters T1
    (the default mode puts it in T2, as the paper does); only `touch` or a used key
    of `reorder_many` moves an entry to T2, the other keys of `reorder_many` stay in
    T1 and only move to its newest end."""
    a, b, c, d = KEYS[:4]
    for keep in (True, False):
        policy: Any = build(lambda: SlotARCPolicy.for_slots(3), use_native)
        if keep:
            policy.keep_pinned_in_place()
        policy.insert(a, 0)
        policy.insert(b, 1)
        policy.insert(c, 2)
        assert policy.evict(1) == [a]  # to B1
        policy.insert_pinned([a], [0])  # remembered
        assert policy.p == 1.0
        policy.unpin(a)
        policy.touch(b)
        # In place: T1 = [c, a], T2 = [b]; by default T1 = [c], T2 = [a, b]. With
        # p = 1 the victims are T1's beyond p, then T2, then the rest of T1.
        assert policy.export() == ([c, b, a] if keep else [a, b, c])
    policy = in_place(SlotARCPolicy, 4, use_native)
    for slot, key in enumerate((a, b, c, d)):
        policy.insert(key, slot)
    policy.reorder_many([d, a, b], used={b})  # d, a: newest of T1; b: T2
    assert policy.export() == [c, d, a, b]


@pytest.mark.parametrize("cls", [LRUPolicy, ARCPolicy, SievePolicy])
def test_the_other_policies_keep_the_default(cls: type[EvictionPolicy]) -> None:
    """Dict policies and SIEVE have no in-place mode: they say so and change
    nothing; `reorder_many` still counts the used keys as uses (LRU: all keys)."""
    policy: Any = cls.for_slots(SLOTS) if cls is SievePolicy else cls(SLOTS)
    assert policy.keep_pinned_in_place() is False
    assert policy.pinned_in_place is False
    a, b = KEYS[:2]
    policy.insert(a, 0)
    policy.insert(b, 1)
    policy.reorder_many([a], used={a})
    assert policy.evict(1) == [b]


@pytest.mark.parametrize("cls", [SlotLRUPolicy, SlotARCPolicy])
def test_only_an_empty_policy_switches(cls: type[EvictionPolicy]) -> None:
    policy: Any = cls.for_slots(SLOTS)
    policy.insert(KEYS[0], 0)
    with pytest.raises(ValueError, match="empty"):
        policy.keep_pinned_in_place()


@pytest.mark.parametrize("cls", [SlotLRUPolicy, SlotARCPolicy])
def test_the_manager_with_in_place_pins(cls: type[EvictionPolicy]) -> None:
    """Through the manager: a load's end is no use, `reorder` is (the head of a
    prefix last, the newest), and eviction passes over blocks being loaded."""
    policy: Any = cls.for_slots(4)
    assert policy.keep_pinned_in_place()
    m = TieringOffloadingManager(4, policy)
    assert m.pinned_in_place
    head, mid, tail, other, new = KEYS[:5]
    out = m.prepare_store([head, mid, tail])
    assert out is not None
    m.complete_store([head, mid, tail])
    m.reorder([tail, mid, head], used=())  # the request's prefix, tail first
    out = m.prepare_store([other])
    assert out is not None
    m.complete_store([other])
    m.prepare_load([tail])  # its end does not refresh it
    m.complete_load([tail])
    m.prepare_load([mid])  # held while the pool evicts: passed over
    out = m.prepare_store([new])
    assert out is not None and out.evicted == [tail]
    m.complete_store([new])
    m.complete_load([mid])  # comes back as the oldest
    out = m.prepare_store([KEYS[5]])
    assert out is not None and out.evicted == [mid]
    assert m.slot_of(head) is not None
