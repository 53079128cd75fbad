"""Least recently used, for a CPU pool whose values are slot numbers.

The same policy as `LRUPolicy`, laid out for the scheduler's memory budget: an
index maps key -> slot (`slot_index`: the C table, ~10 bytes per entry, or a dict,
~52 plus the value's int object), and recency is a doubly linked list threaded
through two int32 arrays indexed by slot (plus a slot -> key list for eviction and a
pinned byte). An OrderedDict costs ~120-150 bytes per entry under churn; this costs
the index entry, 8 bytes of links, 8 of back-reference and 1.

Pinned entries are unlinked, so eviction walks unpinned entries only: O(1) per
victim. The batch calls are one `slot_links.move` each (C when built).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, ClassVar, cast

from kvtiers.policies.slot_index import SlotIndexPolicy
from kvtiers.policies.slot_links import LINK, UNLINK, table

# The batch calls as list moves over the pinned byte (see `slot_links.move`).
_PIN = table(2, {0: (1, UNLINK)})
_UNPIN = table(2, {1: (0, LINK)})
_TOUCH = table(2, {0: (0, UNLINK | LINK)})


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
        self._init_links(1)
        self._heads = (head, head)
        self._pinned = bytearray(capacity)
        self.pinned_count = 0

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
        if slot is None or self._pinned[slot]:
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

    def pin(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None or self._pinned[slot]:
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
        if slot is None or not self._pinned[slot]:
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
        moved = self._move(self._pinned, self._prev, self._next, slots, _PIN, self._heads)
        self.pinned_count += moved[0]

    def unpin_many(self, keys: Iterable[Hashable]) -> None:
        slots = list(map(self._index.get, keys))
        moved = self._move(self._pinned, self._prev, self._next, slots, _UNPIN, self._heads)
        self.pinned_count -= moved[1]

    def touch_many(self, keys: Iterable[Hashable]) -> None:
        found = list(map(self._index.get, keys))
        slots = cast("list[int]", [s for s in found if s is not None] if None in found else found)
        if not self._gather(self._pinned, slots).count(0):
            return  # all pinned (an engine touches what it just loaded): nothing moves
        self._move(self._pinned, self._prev, self._next, slots, _TOUCH, self._heads)

    def insert_pinned(self, keys: Iterable[Hashable], values: Iterable[Any]) -> None:
        index, klist, pinned, limit = self._index, self._keys, self._pinned, self._head
        count = 0
        for key, slot in zip(keys, values, strict=True):
            if key in index or type(slot) is not int or not 0 <= slot < limit:
                self.insert(key, slot)  # a use (or the error) as `insert` gives it
                self.pin(key)
                continue
            index[key] = slot
            klist[slot] = key
            pinned[slot] = 1  # never linked: a pinned entry is not in the list
            count += 1
        self.pinned_count += count
        self._count_inserts(count)

    def evict_items(self, n: int = 1) -> list[tuple[Hashable, Any]]:
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

    def remove(self, key: Hashable) -> None:
        slot = self._index.pop(key, None)
        if slot is None:
            return
        self._keys[slot] = None
        if self._pinned[slot]:
            self._pinned[slot] = 0
            self.pinned_count -= 1
        else:
            self._unlink(slot)

    def is_pinned(self, key: Hashable) -> bool:
        slot = self._index.get(key)
        return slot is not None and bool(self._pinned[slot])

    def export(self) -> list[Any]:
        """Unpinned keys oldest first, then pinned keys (as `LRUPolicy.export`)."""
        out: list[Any] = []
        head, nxt, keys = self._head, self._next, self._keys
        slot = nxt[head]
        while slot != head:
            out.append(keys[slot])
            slot = nxt[slot]
        pinned = self._pinned
        out.extend(k for k, s in self._index.items() if pinned[s])
        return out
