"""The CPU pool's slot-indexed LRU, SIEVE and ARC (`LRUPolicy.for_slots`,
`SievePolicy.for_slots`, `ARCPolicy.for_slots`) behave exactly like the dict-based
policies: a differential
state machine drives both with the same calls and compares victims, `examined`,
exports and lookups after every step, on the C path (`kvtiers.policies._slotlinks`,
when built) and on the pure-Python one. Also: `GhostLists` (and its C form) against
ordered dicts, and the two `move`s against each other."""

from __future__ import annotations

import random
from array import array
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.policies import slot_links
from kvtiers.policies.arc import ARCPolicy
from kvtiers.policies.ghosts import GhostLists
from kvtiers.policies.lru import LRUPolicy
from kvtiers.policies.sieve import SievePolicy
from kvtiers.policies.slot_arc import SlotARCPolicy
from kvtiers.policies.slot_lru import SlotLRUPolicy
from kvtiers.policies.slot_sieve import SlotSievePolicy

SLOTS = 8
KEYS = [f"k{i}".encode() for i in range(14)]


native = pytest.mark.skipif(
    not slot_links.NATIVE, reason="kvtiers.policies._slotlinks was not built"
)
PATHS = [pytest.param(True, marks=native, id="native"), pytest.param(False, id="python")]


def build(make: Any, use_native: bool) -> Any:
    """`make()` with the policies' C helper on or off."""
    saved = slot_links.USE_NATIVE
    slot_links.USE_NATIVE = use_native and slot_links.NATIVE
    try:
        return make()
    finally:
        slot_links.USE_NATIVE = saved


class SameAsReference(RuleBasedStateMachine):
    ref_cls: type[EvictionPolicy]
    use_native = True

    def __init__(self) -> None:
        super().__init__()
        self.ref: Any = self.ref_cls(SLOTS)
        self.fast: Any = build(lambda: self.ref_cls.for_slots(SLOTS), self.use_native)
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


class SameAsLRUPython(SameAsLRU):
    use_native = False


class SameAsARCPython(SameAsARC):
    use_native = False


TestSameAsLRU = SameAsLRU.TestCase
TestSameAsLRU.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestSameAsSieve = SameAsSieve.TestCase
TestSameAsSieve.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestSameAsARC = SameAsARC.TestCase
TestSameAsARC.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
# The pure-Python path (SIEVE has no C part). Where the helper was not built, the
# classes above run this path already.
TestSameAsLRUPython = SameAsLRUPython.TestCase
TestSameAsLRUPython.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestSameAsARCPython = SameAsARCPython.TestCase
TestSameAsARCPython.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("cls", [SlotSievePolicy, SlotARCPolicy, SlotLRUPolicy])
def test_long_random_run_matches_the_reference(cls: type[EvictionPolicy], use_native: bool) -> None:
    """Thousands of operations over a pool of 64 slots (ghost tables grow, rings
    compact, the dict index is rebuilt), single and batch calls: the same victims
    all along."""
    refs: dict[Any, type[EvictionPolicy]] = {SlotSievePolicy: SievePolicy, SlotARCPolicy: ARCPolicy}
    ref_cls = refs.get(cls, LRUPolicy)
    n = 64
    ref: Any = ref_cls(n)
    fast: Any = build(lambda: cls(n), use_native)
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
            batch = [*rng.sample(keys, rng.randrange(1, 6)), key]
            if op < 0.65:
                ref.touch(key)
                fast.touch(key)
            else:
                for k in batch:
                    ref.touch(k)
                fast.touch_many(batch)
        elif op < 0.85:
            batch = [*rng.sample(keys, rng.randrange(1, 6)), key]
            if op < 0.8:
                ref.pin(key)
                fast.pin(key)
                batch = [key]
            else:
                for k in batch:
                    ref.pin(k)
                fast.pin_many(batch)
            pinned.update(k for k in batch if k in ref)
        elif op < 0.95:
            batch = [*rng.sample(keys, rng.randrange(1, 6)), key]
            if op < 0.9:
                ref.unpin(key)
                fast.unpin(key)
                batch = [key]
            else:
                for k in batch:
                    ref.unpin(k)
                fast.unpin_many(batch)
            pinned.difference_update(batch)
        else:
            slot = ref.get(key)
            ref.remove(key)
            fast.remove(key)
            pinned.discard(key)
            if slot is not None:
                free.append(slot)
        assert len(fast) == len(ref)
    npinned = len(pinned)
    assert fast.export()[: len(ref) - npinned] == ref.export()[: len(ref) - npinned]


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


@pytest.mark.parametrize("use_native", PATHS)
def test_ghost_lists_match_ordered_dicts(use_native: bool) -> None:
    """Random adds, hits and front drops against two ordered dicts (the structure
    ARCPolicy uses), through table growth and ring compaction (C: ring growth and
    wrap-around)."""
    ghosts: Any = GhostLists() if not use_native else slot_links._native.Ghosts()
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
    ghosts.clear()
    assert (len(ghosts), ghosts.len1, ghosts.len2, ghosts.find(pool[0])) == (0, 0, 0, 0)


@native
def test_ghosts_argument_errors() -> None:
    ghosts = slot_links._native.Ghosts()
    with pytest.raises(ValueError, match="1 or 2"):
        ghosts.add(3, 5)
    with pytest.raises(ValueError, match="1 or 2"):
        ghosts.pop_oldest(0)
    with pytest.raises(TypeError):
        ghosts.find("a")
    with pytest.raises(TypeError):
        slot_links._native.Ghosts(1)


def random_lists(rng: random.Random, n: int, k: int) -> tuple[bytearray, Any, Any, list[int]]:
    """`n` slots with random marks below `k`, each slot linked (in random order) in
    the list of its mark's head `n + mark`, or unlinked (mark 0 stays unlinked)."""
    marks = bytearray(rng.randrange(k) for _ in range(n))
    heads = [n + m for m in range(k)]
    prev = array("i", range(n + k))
    nxt = array("i", range(n + k))
    order = list(range(n))
    rng.shuffle(order)
    for slot in order:
        if marks[slot]:
            h = heads[marks[slot]]
            last = prev[h]
            nxt[last] = slot
            prev[slot] = last
            nxt[slot] = h
            prev[h] = slot
    return marks, prev, nxt, heads


@native
def test_native_and_python_moves_agree() -> None:
    """Random tables (marks 1.. are linked, 0 is not: unlink only from a linked mark,
    link only into one) over random slot lists, None and repeats included."""
    rng = random.Random(17)
    k, n = 4, 40
    c_move = slot_links._native.move
    a = random_lists(rng, n, k)
    b = (bytearray(a[0]), array("i", a[1]), array("i", a[2]), a[3])
    for _ in range(3000):
        moves = {}
        for old in range(k):
            if rng.random() < 0.6:
                new = rng.randrange(k)
                action = (slot_links.UNLINK if old else 0) | (slot_links.LINK if new else 0)
                moves[old] = (new, action)
        tab = slot_links.table(k, moves)
        slots: list[int | None] = [
            rng.randrange(n) if rng.random() < 0.9 else None for _ in range(8)
        ]
        got = slot_links.move_py(a[0], a[1], a[2], slots, tab, a[3])
        assert c_move(b[0], b[1], b[2], slots, tab, b[3]) == got
        assert a[:3] == b[:3]


@pytest.mark.parametrize("use_native", PATHS)
def test_move_errors(use_native: bool) -> None:
    move = slot_links._native.move if use_native else slot_links.move_py
    rng = random.Random(2)
    marks, prev, nxt, heads = random_lists(rng, 6, 2)
    tab = slot_links.table(2, {1: (0, slot_links.UNLINK)})
    with pytest.raises(IndexError):
        move(marks, prev, nxt, [6], tab, heads)
    with pytest.raises(ValueError, match="heads"):
        move(marks, prev, nxt, [0], tab, heads[:1])
    with pytest.raises(ValueError, match="even"):
        move(marks, prev, nxt, [0], tab + b"\0", heads)
    marks[0] = 2
    with pytest.raises(ValueError, match="mark 2"):
        move(marks, prev, nxt, [0], tab, heads)
    assert move(marks, prev, nxt, [None, 1], slot_links.table(2, {}), heads) == [0, 0]


@native
def test_slot_index_matches_a_dict() -> None:
    """The C index against a dict plus the slot -> key list the policies keep:
    random inserts, removals (del and pop) and lookups over a small table (long
    probe runs, wrap-around, backward shifts), keys of equal hash but not equal,
    and keys equal but not identical."""
    rng = random.Random(23)
    n = 48
    keys: list[Any] = [None] * n
    index = slot_links._native.SlotIndex(keys)
    ref: dict[Any, int] = {}
    free = list(range(n))
    pool: list[Any] = [rng.randbytes(6) for _ in range(120)] + [
        Collide(i) for i in range(6)
    ]
    for _ in range(40_000):
        key = rng.choice(pool)
        if rng.random() < 0.3 and isinstance(key, bytes):
            key = bytes(bytearray(key))  # equal, another object
        op = rng.random()
        if op < 0.45:
            if key not in ref and free:
                slot = free.pop(rng.randrange(len(free)))
                ref[key] = slot
                index[key] = slot
        elif op < 0.6:
            if key in ref:
                del index[key]
                free.append(ref.pop(key))
            else:
                with pytest.raises(KeyError):
                    del index[key]
        elif op < 0.75:
            got = index.pop(key, None)
            assert got == ref.pop(key, None)
            if got is not None:
                free.append(got)
        else:
            assert index.get(key) == ref.get(key)
            assert index.get(key, -1) == ref.get(key, -1)
            assert (key in index) == (key in ref)
        assert len(index) == len(ref)
    assert sorted(index.items(), key=lambda kv: kv[1]) == sorted(ref.items(), key=lambda kv: kv[1])
    assert keys == [next((k for k, s in ref.items() if s == slot), None) for slot in range(n)]
    for key, slot in ref.items():
        assert index[key] == slot
    with pytest.raises(KeyError):
        index[b"absent"]
    with pytest.raises(KeyError):
        index.pop(b"absent")


class Collide:
    """A key whose hash collides with others' (all hash to 7)."""

    def __init__(self, i: int):
        self.i = i

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Collide) and other.i == self.i


@native
def test_slot_index_refuses_what_would_corrupt_it() -> None:
    keys: list[Any] = [None] * 4
    index = slot_links._native.SlotIndex(keys)
    index[b"a"] = 1
    with pytest.raises(ValueError, match="another key"):
        index[b"b"] = 1  # slot 1 is a's
    with pytest.raises(ValueError, match="out of range"):
        index[b"b"] = 4
    with pytest.raises(TypeError):
        index[[1]] = 2  # unhashable
    with pytest.raises(ValueError, match="all None"):
        slot_links._native.SlotIndex([b"x"])
    keys.append(None)
    with pytest.raises(RuntimeError, match="length"):
        index.get(b"a")
    keys.pop()
    assert index.get(b"a") == 1 and keys[1] == b"a" and len(index) == 1


@pytest.mark.parametrize("use_native", PATHS)
def test_gather(use_native: bool) -> None:
    gather = slot_links._native.gather if use_native else slot_links.gather_py
    rng = random.Random(4)
    buffer = bytearray(rng.randbytes(50))
    slots = [rng.randrange(50) for _ in range(200)]
    assert gather(buffer, slots) == bytes(buffer[s] for s in slots)
    assert gather(memoryview(buffer).toreadonly(), []) == b""
    with pytest.raises(IndexError):
        gather(buffer, [50])
    with pytest.raises(TypeError):
        gather(buffer, [None])  # type: ignore[list-item]
