"""`BoundedIndex`: a state machine against a model (usage within capacity, pinned and
own-job keys never evicted, pins counted, removals reported), plus recency export /
restore through JSON and the cases a tier leans on."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.policies import ARCPolicy, LRUPolicy, SievePolicy
from kvtiers.sdk import BoundedIndex, Pins, Reservation, Verdict
from kvtiers.testing import make_context

KEYS = [bytes([i]) * 3 + b"\x00\x00\x00\x07" for i in range(14)]  # bytes, like BlockKeys
POLICIES: dict[str, type[EvictionPolicy]] = {"lru": LRUPolicy, "sieve": SievePolicy,
                                              "arc": ARCPolicy}
CAPACITY = 10


class Room:
    """A reservation with the model's view of it."""

    def __init__(self, room: Reservation[str]):
        self.room = room
        self.sizes: dict[bytes, int] = {}  # RESERVED, not committed yet
        self.protects: list[tuple[bytes, int]] = []  # (key, generation) pinned for the job


class Held:
    """Pins with the generation of each entry they pinned."""

    def __init__(self, pins: Pins[str], held: list[tuple[bytes, int]]):
        self.pins = pins
        self.held = held


class IndexMachine(RuleBasedStateMachine):
    """The index next to a model: committed key -> size, pin counts per key, open
    reservations with the keys each protects."""

    pins = Bundle("pins")  # Held
    rooms = Bundle("rooms")

    def __init__(self) -> None:
        super().__init__()
        self.removed: list[bytes] = []
        self.index: BoundedIndex[str] = BoundedIndex(LRUPolicy(), CAPACITY,
                                                     on_removed=self.removed.extend)
        self.model: dict[bytes, int] = {}
        self.gen: dict[bytes, int] = {}  # key -> generation of its entry (re-adds differ)
        self.next_gen = 0
        self.pinned: dict[bytes, int] = {}  # key -> pins held (by Pins and reservations)
        self.open_rooms: list[Room] = []  # open reservations
        self.evictions = 0

    @initialize(policy=st.sampled_from(sorted(POLICIES)), capacity_hint=st.sampled_from(
        [None, 4, 10]), queued=st.booleans())
    def make(self, policy: str, capacity_hint: int | None, queued: bool) -> None:
        # queued: pins, releases and touches wait in a queue until the next call that
        # takes the lock (every one of which applies it first): the same answers
        self.index = BoundedIndex(POLICIES[policy](capacity=capacity_hint), CAPACITY,
                                  on_removed=self.removed.extend, queued=queued)

    # Helpers on the model.

    def _born(self, key: bytes, size: int) -> None:
        self.model[key] = size
        self.next_gen += 1
        self.gen[key] = self.next_gen

    def _pin(self, key: bytes) -> tuple[bytes, int]:
        self.pinned[key] = self.pinned.get(key, 0) + 1
        return key, self.gen[key]

    def _unpin(self, held: tuple[bytes, int]) -> None:
        key, gen = held
        if key not in self.model or self.gen[key] != gen:
            return  # that entry is gone: its pin counts for nothing
        self.pinned[key] -= 1
        if not self.pinned[key]:
            del self.pinned[key]

    def _evicted(self, gone: list[tuple[bytes, str]], own: set[bytes]) -> None:
        assert self.removed == [k for k, _ in gone], "evictions not reported as removals"
        self.removed.clear()
        for key, location in gone:
            assert key in self.model, f"evicted {key!r}, which is not held"
            assert key not in self.pinned, f"evicted pinned {key!r}"
            assert key not in own, f"evicted {key!r}, a key of the job being stored"
            assert location == f"at-{key.hex()}"
            del self.model[key]
            self.evictions += 1

    # Rules.

    @rule(target=pins, keys=st.lists(st.sampled_from(KEYS), max_size=4, unique=True))
    def pin(self, keys: list[bytes]) -> Held:
        pins = self.index.pin(keys)
        held = []
        for key, location in zip(keys, pins.locations, strict=True):
            assert (location is not None) == (key in self.model)
            if location is not None:
                held.append(self._pin(key))
        return Held(pins, held)

    @rule(held=consumes(pins))
    def release(self, held: Held) -> None:
        for h in held.held:
            self._unpin(h)
        held.pins.release()
        held.pins.release()  # idempotent

    @rule(target=rooms, items=st.lists(st.tuples(st.sampled_from(KEYS), st.integers(1, 4)),
                                       min_size=1, max_size=5, unique_by=lambda t: t[0]))
    def reserve(self, items: list[tuple[bytes, int]]) -> Room:
        own = {k for k, _ in items}
        before = dict(self.model)
        room = Room(self.index.reserve(items))
        self._evicted(room.room.evicted, own)
        for (key, size), verdict in zip(items, room.room.verdicts, strict=True):
            if key in before:
                assert verdict is Verdict.PRESENT
                room.protects.append(self._pin(key))
            elif verdict is Verdict.RESERVED:
                room.sizes[key] = size
            else:
                assert verdict is Verdict.FULL
        self.open_rooms.append(room)
        return room

    @rule(room=rooms, data=st.data())
    def commit(self, room: Room, data: st.DataObject) -> None:
        if not room.sizes:
            return
        key = data.draw(st.sampled_from(sorted(room.sizes)))
        size = room.sizes.pop(key)
        won = room.room.commit(key, f"at-{key.hex()}")
        assert won == (key not in self.model)
        if won:
            self._born(key, size)
            room.protects.append(self._pin(key))

    @rule(room=consumes(rooms))
    def close(self, room: Room) -> None:
        room.room.close()
        room.room.close()
        self.open_rooms.remove(room)
        room.sizes.clear()
        for held in room.protects:
            self._unpin(held)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=4))
    def touch(self, keys: list[bytes]) -> None:
        self.index.touch(keys)

    @rule(key=st.sampled_from(KEYS), size=st.integers(1, 4))
    def add(self, key: bytes, size: int) -> None:
        if key in self.model:
            with pytest.raises(KeyError):
                self.index.add(key, "dup", size)
            return
        left = self.index.add(key, f"at-{key.hex()}", size)
        refused = (key, f"at-{key.hex()}") in left
        self._evicted([e for e in left if e[0] != key], set())
        if not refused:
            self._born(key, size)

    @rule(key=st.sampled_from(KEYS), match=st.booleans())
    def remove(self, key: bytes, match: bool) -> None:
        where = f"at-{key.hex()}" if match else "elsewhere"
        got = self.index.remove(key, where)
        if key in self.model and match:
            assert got == where and self.removed == [key]
            self.removed.clear()
            del self.model[key]
            self.pinned.pop(key, None)  # its pins now count nothing
        else:
            assert got is None

    @precondition(lambda self: self.model)
    @rule()
    def export_restore_keeps_order(self) -> None:
        state = json.loads(json.dumps(self.index.export()))
        before = self.index.view().order
        assert self.index.restore(state) == len(self.model)
        assert self.index.view().order == before

    # Invariants.

    @invariant()
    def within_capacity_and_counted(self) -> None:
        view = self.index.view()
        reserved = sum(sum(r.sizes.values()) for r in self.open_rooms)
        assert view.committed_bytes == sum(self.model.values())
        assert view.reserved_bytes == reserved
        assert view.used_bytes <= CAPACITY
        assert {k: e.size for k, e in view.entries.items()} == self.model
        assert {k: e.pins for k, e in view.entries.items() if e.pins} == self.pinned
        assert view.evictable_bytes == sum(
            s for k, s in self.model.items() if k not in self.pinned)
        assert sorted(view.order) == sorted(self.model)
        assert view.evictions == self.evictions

    @invariant()
    def nothing_else_is_reported_removed(self) -> None:
        assert self.removed == []


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# Recency through JSON.


@settings(max_examples=60, deadline=None)
@given(policy=st.sampled_from(sorted(POLICIES)),
       ops=st.lists(st.tuples(st.sampled_from(["add", "touch"]), st.sampled_from(KEYS)),
                    max_size=40),
       seed=st.integers(0, 2**32))
def test_export_restore_through_json_keeps_the_eviction_order(
    policy: str, ops: list[tuple[str, bytes]], seed: int
) -> None:
    big = 1000
    old: BoundedIndex[int] = BoundedIndex(POLICIES[policy](), big)
    for op, key in ops:
        if op == "add" and key not in old:
            old.add(key, 0, 1)
        else:
            old.touch([key])
    text = json.dumps(old.export())
    # A restart: the entries come back in another order (a directory scan), then
    # the saved recency is applied.
    new: BoundedIndex[int] = BoundedIndex(POLICIES[policy](), big)
    keys = list(old.view().entries)
    random.Random(seed).shuffle(keys)
    for key in keys:
        new.add(key, 0, 1)
    assert new.restore(json.loads(text)) == len(keys)
    assert new.view().order == old.view().order  # the next victims are the same


def test_export_is_hex_strings_and_restore_refuses_other_input() -> None:
    index: BoundedIndex[int] = BoundedIndex(LRUPolicy(), 10)
    index.add(b"\x00\xffab", 1, 1)
    assert index.export() == ["00ff6162"]
    with pytest.raises(ValueError, match="hex strings"):
        index.restore([17])
    with pytest.raises(ValueError, match="not hex"):
        index.restore(["zz"])
    assert index.restore(["0102", "00ff6162"]) == 1  # unknown keys are skipped


def test_restore_puts_named_entries_newest_in_order_and_keeps_pins() -> None:
    index: BoundedIndex[int] = BoundedIndex(LRUPolicy(), 10)
    a, b, c, d = (bytes([i]) for i in range(4))
    for key in (a, b, c, d):
        index.add(key, 0, 1)
    pins = index.pin([b])
    index.restore([d.hex(), a.hex()])
    assert index.view().order == [c, d, a, b]  # unnamed first; the pinned one last
    pins.release()
    assert index.view().order == [c, d, a, b]


# What tiers rely on.


def test_a_job_larger_than_the_index_keeps_its_own_blocks() -> None:
    index: BoundedIndex[str] = BoundedIndex(LRUPolicy(), 3)
    keys = [bytes([i]) for i in range(5)]
    with index.reserve([(k, 1) for k in keys]) as room:
        assert room.verdicts == [Verdict.RESERVED] * 3 + [Verdict.FULL] * 2
        for k in keys[:3]:
            assert k not in index  # not visible before the commit
            assert room.commit(k, "x")
    assert [k in index for k in keys] == [True, True, True, False, False]
    assert index.view().reserved_bytes == 0 and index.evictions == 0


def test_a_job_never_evicts_the_keys_it_found_present() -> None:
    index: BoundedIndex[str] = BoundedIndex(LRUPolicy(), 2)
    old, new = b"old", b"new"
    index.add(old, "o", 1)
    index.add(b"other", "t", 1)
    with index.reserve([(new, 1), (old, 1)]) as room:
        # The LRU victim would be `old`, but the job holds it: `other` goes.
        assert room.verdicts == [Verdict.RESERVED, Verdict.PRESENT]
        assert room.evicted == [(b"other", "t")]
        assert room.commit(new, "n")
    assert old in index and new in index


def test_pins_are_counted_and_a_pinned_entry_is_not_evicted() -> None:
    removed: list[bytes] = []
    index: BoundedIndex[str] = BoundedIndex(LRUPolicy(), 1, on_removed=removed.extend)
    index.add(b"a", "a", 1)
    first, second = index.pin([b"a"]), index.pin([b"a", b"zz"])
    assert second.locations == ["a", None]
    first.release()
    assert index.reserve([(b"b", 1)]).verdicts == [Verdict.FULL]  # still pinned once
    second.release()
    room = index.reserve([(b"b", 1)])
    assert room.verdicts == [Verdict.RESERVED] and room.evicted == [(b"a", "a")]
    assert removed == [b"a"]


def test_a_removed_pinned_entry_does_not_unpin_its_successor() -> None:
    index: BoundedIndex[str] = BoundedIndex(LRUPolicy(), 4)
    index.add(b"k", "old", 1)
    pins = index.pin([b"k"])
    assert index.remove(b"k", "old") == "old"
    index.add(b"k", "new", 1)
    held = index.pin([b"k"])
    pins.release()  # the old entry's pin: must not touch the new entry's count
    assert index.view().entries[b"k"].pins == 1
    held.release()


def test_a_second_commit_of_one_key_keeps_the_first_copy() -> None:
    index: BoundedIndex[str] = BoundedIndex(LRUPolicy(), 4)
    one, two = index.reserve([(b"k", 1)]), index.reserve([(b"k", 1)])
    assert one.verdicts == two.verdicts == [Verdict.RESERVED]
    assert one.commit(b"k", "first") and not two.commit(b"k", "second")
    one.close()
    two.close()
    assert index.get(b"k") == "first" and index.view().used_bytes == 1


def test_for_tier_builds_the_registered_policy_and_reports_to_events() -> None:
    ctx = make_context(4096, 4)
    ctx.events.enable()
    index: BoundedIndex[Any] = BoundedIndex.for_tier(ctx, policy="sieve",
                                                     capacity_bytes=2 * 4096)
    index.add(b"a", 0, 4096)
    index.add(b"b", 0, 4096)
    assert index.add(b"c", 0, 4096) != []
    assert ctx.events.take() == [b"a"] and index.view().capacity_bytes == 8192


def test_export_does_not_hold_the_lock_while_encoding() -> None:
    """The scheduler thread's calls are not held up by an export: while the keys are
    encoded, another thread's `touch` goes through."""
    index: BoundedIndex[int] = BoundedIndex(LRUPolicy(), 100)
    went_through: list[bool] = []

    class Spy(bytes):
        def __bytes__(self) -> bytes:  # called while the export encodes this key
            other = threading.Thread(target=index.touch, args=([b"plain"],))
            other.start()
            other.join(30)
            went_through.append(not other.is_alive())
            return b"" + self

    index.add(b"plain", 0, 1)
    index.add(Spy(b"spy"), 1, 1)
    assert index.export() == [b"plain".hex(), b"spy".hex()]
    assert went_through == [True]
