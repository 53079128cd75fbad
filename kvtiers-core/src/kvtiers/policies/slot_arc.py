"""ARC for a CPU pool whose values are slot numbers: `ARCPolicy`'s algorithm (same
victims, same `p`, same ghosts) laid out like `SlotLRUPolicy`.

T1 and T2 are two doubly linked lists threaded through the same int32 arrays
indexed by slot (a sentinel each), oldest first; one byte per slot says where the
entry is (T1, T2, or pinned out of either: P1, P2); a key -> slot index (`slot_index`:
the C table or a compact dict) and a slot -> key list complete the resident side,
~27 bytes per entry with the C index, ~70 with the dict. The ghosts B1 and B2 are
`ghost_lists()` (flat arrays, in C when built, ~20-40 bytes per ghost) instead of
ordered dicts of ints (~130). Lookups are one bound `get` of the index, where
`ARCPolicy.get` is a Python method over four dicts; the batch calls are one
`slot_links.move` each.

Pinned entries are unlinked, so eviction never meets them: O(1) per victim plus the
ghosts it drops (each ghost is added and dropped once: O(1) amortised).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Any, ClassVar, cast

from kvtiers.policies.ghosts import ghost_lists
from kvtiers.policies.slot_index import SlotIndexPolicy
from kvtiers.policies.slot_links import LINK, UNLINK, table

# Where an entry is (one byte per slot).
_T1, _T2, _P1, _P2 = 1, 2, 3, 4
# The batch calls as list moves (see `slot_links.move`): old mark -> (new, action).
_PIN = table(5, {_T1: (_P1, UNLINK), _T2: (_P2, UNLINK)})
_UNPIN = table(5, {_P1: (_T1, LINK), _P2: (_T2, LINK)})
_TOUCH = table(5, {_T1: (_T2, UNLINK | LINK), _T2: (_T2, UNLINK | LINK), _P1: (_P2, 0)})


class SlotARCPolicy(SlotIndexPolicy):
    """ARC over values that are slot numbers in `0..capacity-1` (each used by at
    most one entry at a time). `capacity` is also ARC's `c`."""

    name: ClassVar[str] = "arc"
    restores_as: ClassVar[str] = "an ARCPolicy"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        assert capacity is not None
        self._h1, self._h2 = capacity, capacity + 1  # the heads of T1 and T2
        self._init_links(2)
        self._heads = (0, self._h1, self._h2, 0, 0)  # the list of each mark (T1, T2)
        self._where = bytearray(capacity)
        self._ghosts = ghost_lists()
        self._n1 = self._n2 = self._np1 = 0  # entries in T1, T2, P1
        self.p = 0.0  # target size of T1, in 0..c
        self._c = capacity

    # The policy.

    def insert(self, key: Hashable, value: Any = None) -> None:
        """As `ARCPolicy.insert`: a present key is only touched; a key remembered
        by a ghost list adapts `p` and goes to T2."""
        index = self._index
        if key in index:
            self.touch(key)
            return
        self._check_slot(value)
        ghosts = self._ghosts
        ghost = hash(key)
        where = ghosts.find(ghost)
        if where == 1:  # evicted from T1 too early: give T1 more room
            self.p = min(self._c, self.p + max(1.0, ghosts.len2 / ghosts.len1))
            ghosts.discard(ghost)
            self._append(self._h2, value)
            self._where[value] = _T2
            self._n2 += 1
        elif where == 2:  # evicted from T2 too early: give T2 more room
            self.p = max(0.0, self.p - max(1.0, ghosts.len1 / ghosts.len2))
            ghosts.discard(ghost)
            self._append(self._h2, value)
            self._where[value] = _T2
            self._n2 += 1
        else:
            self._append(self._h1, value)
            self._where[value] = _T1
            self._n1 += 1
            if ghosts.len1 and self._n1 + self._np1 + ghosts.len1 > self._c:
                ghosts.pop_oldest(1)  # the paper's |T1| + |B1| <= c, kept on arrival
        index[key] = value
        self._keys[value] = key
        self._count_inserts()

    def touch(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None:
            return
        where = self._where[slot]
        if where == _T1:
            self._unlink(slot)
            self._append(self._h2, slot)
            self._where[slot] = _T2
            self._n1 -= 1
            self._n2 += 1
        elif where == _T2:
            self._unlink(slot)
            self._append(self._h2, slot)
        elif where == _P1:
            self._where[slot] = _P2
            self._np1 -= 1

    def touch_many(self, keys: Iterable[Hashable]) -> None:
        found = list(map(self._index.get, keys))
        slots = cast("list[int]", [s for s in found if s is not None] if None in found else found)
        where = self._where
        if self._gather(where, slots).count(_P2) == len(slots):
            return  # all pinned and already in T2's side (the common case: just loaded)
        moved = self._move(where, self._prev, self._next, slots, _TOUCH, self._heads)
        self._n1 -= moved[_T1]
        self._n2 += moved[_T1]
        self._np1 -= moved[_P1]

    def pin(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None:
            return
        where = self._where[slot]
        if where == _T1:
            self._unlink(slot)
            self._where[slot] = _P1
            self._n1 -= 1
            self._np1 += 1
        elif where == _T2:
            self._unlink(slot)
            self._where[slot] = _P2
            self._n2 -= 1

    def unpin(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None:
            return
        where = self._where[slot]
        if where == _P1:
            self._append(self._h1, slot)
            self._where[slot] = _T1
            self._np1 -= 1
            self._n1 += 1
        elif where == _P2:
            self._append(self._h2, slot)
            self._where[slot] = _T2
            self._n2 += 1

    # Batch forms (the pool calls these per engine call): one list move per call
    # (`slot_links.move`, C when built), counted per list after it.

    def pin_many(self, keys: Iterable[Hashable]) -> None:
        slots = list(map(self._index.get, keys))
        moved = self._move(self._where, self._prev, self._next, slots, _PIN, self._heads)
        self._n1 -= moved[_T1]
        self._np1 += moved[_T1]
        self._n2 -= moved[_T2]

    def unpin_many(self, keys: Iterable[Hashable]) -> None:
        slots = list(map(self._index.get, keys))
        moved = self._move(self._where, self._prev, self._next, slots, _UNPIN, self._heads)
        self._np1 -= moved[_P1]
        self._n1 += moved[_P1]
        self._n2 += moved[_P2]

    def insert_pinned(self, keys: Iterable[Hashable], values: Iterable[Any]) -> None:
        """`insert` then `pin` per pair: a new entry goes straight to P1 (or P2 when
        a ghost remembered it), never linked."""
        index, klist, where, ghosts = self._index, self._keys, self._where, self._ghosts
        find, discard, limit = ghosts.find, ghosts.discard, self._slots
        count = 0
        for key, slot in zip(keys, values, strict=True):
            if key in index or type(slot) is not int or not 0 <= slot < limit:
                self.insert(key, slot)  # a use (or the error) as `insert` gives it
                self.pin(key)
                continue
            ghost = hash(key)
            found = find(ghost)
            if found == 1:  # as `insert`: T2, then pinned out of it
                self.p = min(self._c, self.p + max(1.0, ghosts.len2 / ghosts.len1))
                discard(ghost)
                where[slot] = _P2
            elif found == 2:
                self.p = max(0.0, self.p - max(1.0, ghosts.len1 / ghosts.len2))
                discard(ghost)
                where[slot] = _P2
            else:
                where[slot] = _P1
                self._np1 += 1
                if ghosts.len1 and self._n1 + self._np1 + ghosts.len1 > self._c:
                    ghosts.pop_oldest(1)
            index[key] = slot
            klist[slot] = key
            count += 1
        self._count_inserts(count)

    def evict_items(self, n: int = 1) -> list[tuple[Hashable, Any]]:
        keys, index, where, ghosts = self._keys, self._index, self._where, self._ghosts
        prev, nxt, add = self._prev, self._next, ghosts.add
        pinned_t1, p = self._np1, self.p
        n1, n2 = self._n1, self._n2
        victims: list[tuple[Hashable, Any]] = []
        while len(victims) < n:
            if n1 and (n1 + pinned_t1 > p or not n2):
                head = self._h1
                n1 -= 1
                which = 1
            elif n2:
                head = self._h2
                n2 -= 1
                which = 2
            else:
                break
            slot = nxt[head]  # the list's oldest entry leaves it
            after = nxt[slot]
            nxt[head] = after
            prev[after] = head
            key = keys[slot]
            del index[key]  # first: a C index finds the entry through keys
            where[slot] = 0
            keys[slot] = None
            add(which, hash(key))
            victims.append((key, slot))
        self._n1, self._n2 = n1, n2
        self.examined += len(victims)
        c = self._c = self.capacity or max(self._c, len(index) + len(victims))
        # Drop the oldest ghosts beyond the bounds (as ARCPolicy.evict_items).
        while ghosts.len1 and self._n1 + pinned_t1 + ghosts.len1 > c:
            ghosts.pop_oldest(1)
        while ghosts.len1 + ghosts.len2 > c:
            ghosts.pop_oldest(2 if ghosts.len2 else 1)
        return victims

    def remove(self, key: Hashable) -> None:
        slot = self._index.pop(key, None)
        if slot is None:
            return
        self._keys[slot] = None
        where = self._where[slot]
        self._where[slot] = 0
        if where == _T1:
            self._unlink(slot)
            self._n1 -= 1
        elif where == _T2:
            self._unlink(slot)
            self._n2 -= 1
        elif where == _P1:
            self._np1 -= 1

    def is_pinned(self, key: Hashable) -> bool:
        slot = self._index.get(key)
        return slot is not None and self._where[slot] >= _P1

    def _list(self, head: int) -> list[Hashable | None]:
        out = []
        nxt, keys = self._next, self._keys
        slot = nxt[head]
        while slot != head:
            out.append(keys[slot])
            slot = nxt[slot]
        return out

    def export(self) -> list[Any]:
        """As `ARCPolicy.export`: the eviction order if nothing were used again,
        then pinned keys (those of T1 first)."""
        t1 = self._list(self._h1)
        first = len(t1)
        if self._n2:
            first = max(0, math.ceil(len(t1) + self._np1 - self.p))
        where = self._where
        p1 = [k for k, s in self._index.items() if where[s] == _P1]
        p2 = [k for k, s in self._index.items() if where[s] == _P2]
        return [*t1[:first], *self._list(self._h2), *t1[first:], *p1, *p2]
