"""Least recently used, for a CPU pool whose values are slot numbers.

The same policy as `LRUPolicy`, laid out for the scheduler's memory budget: an
index maps key -> slot (`slot_index`: the C table, ~10 bytes per entry, or a dict,
~52 plus the value's int object), and recency is a doubly linked list threaded
through two int32 arrays indexed by slot (plus a slot -> key list for eviction and a
pinned byte). An OrderedDict costs ~120-150 bytes per entry under churn; this costs
the index entry, 8 bytes of links, 8 of back-reference and 1.

Pinned entries are unlinked, so eviction walks unpinned entries only: O(1) per
victim. The batch calls are one `slot_links.move` each (C when built).

In-place pins (`keep_pinned_in_place`, see `kvtiers.contract.eviction`): a pinned
entry stays linked where it is; eviction unlinks the pinned entries it meets
(marked "passed"), and unpinning links such an entry at the newest end of a second
list, the front, which eviction walks first (so it comes back as the oldest). The
marks byte per slot then says: linked, pinned (linked), passed (pinned, unlinked),
or in the front list.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable
from typing import Any, ClassVar, cast

from kvtiers.policies.slot_index import SlotIndexPolicy
from kvtiers.policies.slot_links import LINK, UNLINK, table

# The batch calls as list moves over the pinned byte (see `slot_links.move`).
_PIN = table(2, {0: (1, UNLINK)})
_UNPIN = table(2, {1: (0, LINK)})
_TOUCH = table(2, {0: (0, UNLINK | LINK)})

# In-place pins: the marks (one byte per slot) and their list moves.
_LINKED, _PINNED, _PASSED, _FRONT = 0, 1, 2, 3
_PIN_IN_PLACE = table(4, {_LINKED: (_PINNED, 0), _FRONT: (_PINNED, 0)})
_UNPIN_IN_PLACE = table(4, {_PINNED: (_LINKED, 0), _PASSED: (_FRONT, LINK)})
# A new pinned entry (not linked, mark 0): linked as the newest, pinned.
_NEW_PINNED = table(4, {_LINKED: (_PINNED, LINK)})
_TOUCH_IN_PLACE = table(4, {
    _LINKED: (_LINKED, UNLINK | LINK), _FRONT: (_LINKED, UNLINK | LINK),
    _PINNED: (_PINNED, UNLINK | LINK), _PASSED: (_PINNED, LINK),
})  # fmt: skip


class SlotLRUPolicy(SlotIndexPolicy):
    """LRU over values that are slot numbers in `0..capacity-1` (each used by at
    most one entry at a time)."""

    name: ClassVar[str] = "lru"
    restores_as: ClassVar[str] = "an LRUPolicy"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        assert capacity is not None
        head = capacity  # sentinel: next[head] is the oldest, prev[head] the newest
        self._head = head
        self._front = capacity + 1  # in-place pins: the list eviction walks first
        self._init_links(2)
        self._heads: tuple[int, ...] = (head, head)
        self._pinned = bytearray(capacity)  # the marks: pinned or not (in place: 4 marks)
        self.pinned_count = 0

    def keep_pinned_in_place(self) -> bool:
        if len(self._index):
            raise ValueError("keep_pinned_in_place: the policy must be empty")
        self.pinned_in_place = True
        self._heads = (self._head, self._head, self._head, self._front)
        return True

    def insert(self, key: Hashable, value: Any = None) -> None:
        index = self._index
        slot = index.get(key)
        if slot is not None:
            self.touch(key)
            return
        self._check_slot(value)
        index[key] = value
        self._keys[value] = key
        self._append(self._head, value)
        self._count_inserts()

    def touch(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None:
            return
        if self.pinned_in_place:
            self._touch_in_place(slot)
            return
        if self._pinned[slot]:
            return
        prev, nxt, head = self._prev, self._next, self._head
        p = prev[slot]
        n = nxt[slot]
        nxt[p] = n
        prev[n] = p
        last = prev[head]
        nxt[last] = slot
        prev[slot] = last
        nxt[slot] = head
        prev[head] = slot

    def _touch_in_place(self, slot: int) -> None:
        mark = self._pinned[slot]
        if mark == _PASSED:
            self._pinned[slot] = _PINNED
        else:
            self._unlink(slot)
            if mark == _FRONT:
                self._pinned[slot] = _LINKED
        self._append(self._head, slot)

    def pin(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None:
            return
        if self.pinned_in_place:
            if self._pinned[slot] in (_LINKED, _FRONT):
                self._pinned[slot] = _PINNED  # it stays where it is
                self.pinned_count += 1
            return
        if self._pinned[slot]:
            return
        self._pinned[slot] = 1
        self.pinned_count += 1
        prev, nxt = self._prev, self._next
        p = prev[slot]
        n = nxt[slot]
        nxt[p] = n
        prev[n] = p

    def unpin(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None:
            return
        if self.pinned_in_place:
            mark = self._pinned[slot]
            if mark == _PINNED:
                self._pinned[slot] = _LINKED  # where it was
            elif mark == _PASSED:
                self._pinned[slot] = _FRONT  # eviction passed it: the oldest again
                self._append(self._front, slot)
            else:
                return
            self.pinned_count -= 1
            return
        if not self._pinned[slot]:
            return
        self._pinned[slot] = 0
        self.pinned_count -= 1
        head, prev, nxt = self._head, self._prev, self._next
        last = prev[head]
        nxt[last] = slot
        prev[slot] = last
        nxt[slot] = head
        prev[head] = slot

    # Batch forms (the pool calls these per engine call): one list move per call
    # (`slot_links.move`, C when built).

    def pin_many(self, keys: Iterable[Hashable]) -> None:
        slots = list(map(self._index.get, keys))
        if self.pinned_in_place:
            moved = self._move(
                self._pinned, self._prev, self._next, slots, _PIN_IN_PLACE, self._heads
            )
            self.pinned_count += moved[_LINKED] + moved[_FRONT]
            return
        moved = self._move(self._pinned, self._prev, self._next, slots, _PIN, self._heads)
        self.pinned_count += moved[0]

    def unpin_many(self, keys: Iterable[Hashable]) -> None:
        slots = list(map(self._index.get, keys))
        if self.pinned_in_place:
            moved = self._move(
                self._pinned, self._prev, self._next, slots, _UNPIN_IN_PLACE, self._heads
            )
            self.pinned_count -= moved[_PINNED] + moved[_PASSED]
            return
        moved = self._move(self._pinned, self._prev, self._next, slots, _UNPIN, self._heads)
        self.pinned_count -= moved[1]

    def touch_many(self, keys: Iterable[Hashable]) -> None:
        found = list(map(self._index.get, keys))
        slots = cast("list[int]", [s for s in found if s is not None] if None in found else found)
        if self.pinned_in_place:  # pinned entries move too
            self._move(self._pinned, self._prev, self._next, slots, _TOUCH_IN_PLACE, self._heads)
            return
        if not self._gather(self._pinned, slots).count(0):
            return  # all pinned (an engine touches what it just loaded): nothing moves
        self._move(self._pinned, self._prev, self._next, slots, _TOUCH, self._heads)

    def reorder_many(self, keys: Iterable[Hashable], used: Container[Hashable] = ()) -> None:
        """In LRU a use is recency alone: every key is touched."""
        self.touch_many(keys)

    def insert_pinned(self, keys: Iterable[Hashable], values: Iterable[Any]) -> None:
        if not self.pinned_in_place:
            self._insert_pinned(keys, values, None)
            return
        linked: list[int] = []  # in place: placed as the newest, in one list move
        try:
            self._insert_pinned(keys, values, linked)
        finally:
            if linked:
                self._link_new(linked)

    def _link_new(self, linked: list[int]) -> None:
        """Link the new pinned entries of `linked` as the newest, in order; empty it."""
        self._move(self._pinned, self._prev, self._next, linked, _NEW_PINNED, self._heads)
        linked.clear()

    def _insert_pinned(
        self, keys: Iterable[Hashable], values: Iterable[Any], linked: list[int] | None
    ) -> None:
        index, klist, pinned, limit = self._index, self._keys, self._pinned, self._head
        count = 0
        for key, slot in zip(keys, values, strict=True):
            if key in index or type(slot) is not int or not 0 <= slot < limit:
                if linked:  # the new entries before it are older
                    self._link_new(linked)
                self.insert(key, slot)  # a use (or the error) as `insert` gives it
                self.pin(key)
                continue
            index[key] = slot
            klist[slot] = key
            if linked is None:
                pinned[slot] = 1  # never linked: a pinned entry is not in the list
            else:
                linked.append(slot)  # (its mark is still 0: the move sets it)
            count += 1
            self.pinned_count += 1
        self._count_inserts(count)

    def evict_items(self, n: int = 1) -> list[tuple[Hashable, Any]]:
        if self.pinned_in_place:
            return self._evict_in_place(n)
        head, prev, nxt, keys, index = self._head, self._prev, self._next, self._keys, self._index
        victims: list[tuple[Hashable, Any]] = []
        slot = nxt[head]
        while slot != head and len(victims) < n:
            key = keys[slot]
            del index[key]  # first: a C index finds the entry through keys
            keys[slot] = None
            victims.append((key, slot))
            slot = nxt[slot]
        nxt[head] = slot
        prev[slot] = head
        self.examined += len(victims)
        return victims

    def _evict_in_place(self, n: int) -> list[tuple[Hashable, Any]]:
        """`evict_items` with in-place pins: the front list, then the main one,
        oldest first; a pinned entry met is unlinked and marked passed."""
        nxt, prev, keys, marks = self._next, self._prev, self._keys, self._pinned
        index = self._index
        victims: list[tuple[Hashable, Any]] = []
        passed = 0
        for head in (self._front, self._head):
            slot = nxt[head]
            while slot != head and len(victims) < n:
                after = nxt[slot]
                if marks[slot] == _PINNED:
                    marks[slot] = _PASSED
                    passed += 1
                else:
                    marks[slot] = _LINKED
                    key = keys[slot]
                    del index[key]  # first: a C index finds the entry through keys
                    keys[slot] = None
                    victims.append((key, slot))
                slot = after
            # Everything walked left the list (victims and passed entries alike).
            nxt[head] = slot
            prev[slot] = head
        self.examined += len(victims) + passed
        return victims

    def remove(self, key: Hashable) -> None:
        slot = self._index.pop(key, None)
        if slot is None:
            return
        self._keys[slot] = None
        mark = self._pinned[slot]
        if self.pinned_in_place:
            self._pinned[slot] = _LINKED
            if mark != _PASSED:
                self._unlink(slot)
            if mark in (_PINNED, _PASSED):
                self.pinned_count -= 1
            return
        if mark:
            self._pinned[slot] = 0
            self.pinned_count -= 1
        else:
            self._unlink(slot)

    def is_pinned(self, key: Hashable) -> bool:
        slot = self._index.get(key)
        return slot is not None and self._pinned[slot] in (_PINNED, _PASSED)

    def export(self) -> list[Any]:
        """Unpinned keys oldest first, then pinned keys (as `LRUPolicy.export`)."""
        out: list[Any] = []
        nxt, keys, pinned = self._next, self._keys, self._pinned
        for head in (self._front, self._head):
            slot = nxt[head]
            while slot != head:
                if pinned[slot] not in (_PINNED, _PASSED):
                    out.append(keys[slot])
                slot = nxt[slot]
        out.extend(k for k, s in self._index.items() if pinned[s] in (_PINNED, _PASSED))
        return out
