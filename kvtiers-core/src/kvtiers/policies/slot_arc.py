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

In-place pins (`keep_pinned_in_place`, see `kvtiers.contract.eviction`): a pinned
entry stays linked in its list (P1 in T1's, P2 in T2's); eviction unlinks the
pinned entries it meets (D1, D2: passed), and unpinning links such an entry into a
front list of its own list (F1, F2), which eviction walks first. An insertion is not
a use there: a key the ghosts remember adapts `p` and enters T1.
"""

from __future__ import annotations

import math
from collections.abc import Container, Hashable, Iterable
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

# In-place pins: P1/P2 stay linked; passed over by eviction (D1, D2: unlinked);
# unpinned after that, in the front list of T1 or T2 (F1, F2).
_D1, _D2, _F1, _F2 = 5, 6, 7, 8
_UL = UNLINK | LINK
_PIN_IN_PLACE = table(9, {_T1: (_P1, 0), _F1: (_P1, 0), _T2: (_P2, 0), _F2: (_P2, 0)})
_UNPIN_IN_PLACE = table(9, {_P1: (_T1, 0), _P2: (_T2, 0), _D1: (_F1, LINK), _D2: (_F2, LINK)})
_TOUCH_IN_PLACE = table(9, {
    _T1: (_T2, _UL), _F1: (_T2, _UL), _T2: (_T2, _UL), _F2: (_T2, _UL),
    _P1: (_P2, _UL), _P2: (_P2, _UL), _D1: (_P2, LINK), _D2: (_P2, LINK),
})  # fmt: skip
# Recency alone (`reorder_many`'s keys not used): to the newest end of its own list.
_REFRESH_IN_PLACE = table(9, {
    _T1: (_T1, _UL), _F1: (_T1, _UL), _T2: (_T2, _UL), _F2: (_T2, _UL),
    _P1: (_P1, _UL), _P2: (_P2, _UL), _D1: (_P1, LINK), _D2: (_P2, LINK),
})  # fmt: skip
_REFRESH = table(5, {_T1: (_T1, _UL), _T2: (_T2, _UL)})
_PINNED_MARKS = (_P1, _P2, _D1, _D2)
# A new pinned entry (its slot's mark is 0): linked as the newest of T1.
_NEW_PINNED = table(9, {0: (_P1, LINK)})


class SlotARCPolicy(SlotIndexPolicy):
    """ARC over values that are slot numbers in `0..capacity-1` (each used by at
    most one entry at a time). `capacity` is also ARC's `c`."""

    name: ClassVar[str] = "arc"
    restores_as: ClassVar[str] = "an ARCPolicy"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        assert capacity is not None
        self._h1, self._h2 = capacity, capacity + 1  # the heads of T1 and T2
        self._f1, self._f2 = capacity + 2, capacity + 3  # in-place pins: their fronts
        self._init_links(4)
        # The list of each mark (T1, T2; in place: P1, P2 and the fronts too).
        self._heads: tuple[int, ...] = (0, self._h1, self._h2, 0, 0)
        self._where = bytearray(capacity)
        self._ghosts = ghost_lists()
        self._n1 = self._n2 = self._np1 = 0  # entries in T1, T2, P1
        self.p = 0.0  # target size of T1, in 0..c
        self._c = capacity

    def keep_pinned_in_place(self) -> bool:
        if len(self._index):
            raise ValueError("keep_pinned_in_place: the policy must be empty")
        self.pinned_in_place = True
        h1, h2 = self._h1, self._h2
        self._heads = (0, h1, h2, h1, h2, 0, 0, self._f1, self._f2)
        return True

    # In-place pins: every move is a `slot_links.move` with its table, counted here.

    def _pin_in_place(self, slots: list[Any]) -> None:
        moved = self._move(self._where, self._prev, self._next, slots, _PIN_IN_PLACE, self._heads)
        t1 = moved[_T1] + moved[_F1]
        self._n1 -= t1
        self._np1 += t1
        self._n2 -= moved[_T2] + moved[_F2]

    def _unpin_in_place(self, slots: list[Any]) -> None:
        moved = self._move(self._where, self._prev, self._next, slots, _UNPIN_IN_PLACE, self._heads)
        p1 = moved[_P1] + moved[_D1]
        self._np1 -= p1
        self._n1 += p1
        self._n2 += moved[_P2] + moved[_D2]

    def _touch_in_place(self, slots: list[Any]) -> None:
        moved = self._move(self._where, self._prev, self._next, slots, _TOUCH_IN_PLACE, self._heads)
        t1 = moved[_T1] + moved[_F1]
        self._n1 -= t1
        self._n2 += t1
        self._np1 -= moved[_P1] + moved[_D1]

    def _adapt(self, ghost: int, found: int) -> None:
        """A key its ghost list `found` (1: B1, 2: B2) remembers comes in: adapt `p`
        and forget the ghost."""
        ghosts = self._ghosts
        if found == 1:  # evicted from T1 too early: give T1 more room
            self.p = min(self._c, self.p + max(1.0, ghosts.len2 / ghosts.len1))
        else:  # evicted from T2 too early: give T2 more room
            self.p = max(0.0, self.p - max(1.0, ghosts.len1 / ghosts.len2))
        ghosts.discard(ghost)

    def _insert_in_place(self, key: Hashable, slot: int, pinned: bool) -> None:
        """A new entry with in-place pins: the newest of T1 (pinned: P1, linked
        there too); a ghost only adapts `p`."""
        ghosts = self._ghosts
        ghost = hash(key)
        found = ghosts.find(ghost)
        if found:
            self._adapt(ghost, found)
        self._append(self._h1, slot)
        if pinned:
            self._where[slot] = _P1
            self._np1 += 1
        else:
            self._where[slot] = _T1
            self._n1 += 1
        if not found and ghosts.len1 and self._n1 + self._np1 + ghosts.len1 > self._c:
            ghosts.pop_oldest(1)  # the paper's |T1| + |B1| <= c, kept on arrival
        self._index[key] = slot
        self._keys[slot] = key

    # The policy.

    def insert(self, key: Hashable, value: Any = None) -> None:
        """As `ARCPolicy.insert`: a present key is only touched; a key remembered
        by a ghost list adapts `p` and goes to T2."""
        index = self._index
        if key in index:
            self.touch(key)
            return
        self._check_slot(value)
        if self.pinned_in_place:
            self._insert_in_place(key, value, pinned=False)
            self._count_inserts()
            return
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
        if self.pinned_in_place:
            self._touch_in_place([slot])
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
        if self.pinned_in_place:  # pinned entries move too
            self._touch_in_place(slots)
            return
        where = self._where
        if self._gather(where, slots).count(_P2) == len(slots):
            return  # all pinned and already in T2's side (the common case: just loaded)
        moved = self._move(where, self._prev, self._next, slots, _TOUCH, self._heads)
        self._n1 -= moved[_T1]
        self._n2 += moved[_T1]
        self._np1 -= moved[_P1]

    def reorder_many(self, keys: Iterable[Hashable], used: Container[Hashable] = ()) -> None:
        """In order: a key of `used` is touched, the others move to the newest end
        of their own list (without in-place pins, pinned ones stay out of the
        lists). One list move per run of keys of the same kind."""
        keys = keys if type(keys) is list else list(keys)
        slots = list(map(self._index.get, keys))
        kinds = bytes(map(used.__contains__, keys)) if used else bytes(len(keys))
        n, i = len(kinds), 0
        while i < n:  # runs of used (1) and not used (0) keys
            kind = kinds[i]
            j = kinds.find(b"\x00" if kind else b"\x01", i)
            if j < 0:
                j = n
            self._reorder_run(slots[i:j], bool(kind))
            i = j

    def _reorder_run(self, slots: list[int | None], used: bool) -> None:
        if used:
            if self.pinned_in_place:
                self._touch_in_place(slots)
            else:
                self.touch_many([self._keys[s] for s in slots if s is not None])
            return
        refresh = _REFRESH_IN_PLACE if self.pinned_in_place else _REFRESH
        self._move(self._where, self._prev, self._next, slots, refresh, self._heads)

    def pin(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None:
            return
        if self.pinned_in_place:  # it stays where it is
            where = self._where[slot]
            if where in (_T1, _F1):
                self._where[slot] = _P1
                self._n1 -= 1
                self._np1 += 1
            elif where in (_T2, _F2):
                self._where[slot] = _P2
                self._n2 -= 1
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
        if self.pinned_in_place:
            where = self._where[slot]
            if where in (_P1, _D1):
                self._np1 -= 1
                self._n1 += 1
                self._where[slot] = _T1 if where == _P1 else _F1
                if where == _D1:  # eviction passed it: the oldest of T1 again
                    self._append(self._f1, slot)
            elif where in (_P2, _D2):
                self._n2 += 1
                self._where[slot] = _T2 if where == _P2 else _F2
                if where == _D2:
                    self._append(self._f2, slot)
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
        if self.pinned_in_place:
            self._pin_in_place(slots)
            return
        moved = self._move(self._where, self._prev, self._next, slots, _PIN, self._heads)
        self._n1 -= moved[_T1]
        self._np1 += moved[_T1]
        self._n2 -= moved[_T2]

    def unpin_many(self, keys: Iterable[Hashable]) -> None:
        slots = list(map(self._index.get, keys))
        if self.pinned_in_place:
            self._unpin_in_place(slots)
            return
        moved = self._move(self._where, self._prev, self._next, slots, _UNPIN, self._heads)
        self._np1 -= moved[_P1]
        self._n1 += moved[_P1]
        self._n2 += moved[_P2]

    def insert_pinned(self, keys: Iterable[Hashable], values: Iterable[Any]) -> None:
        """`insert` then `pin` per pair: a new entry goes straight to P1 (or P2 when
        a ghost remembered it), never linked; with in-place pins to P1, linked as
        the newest of T1 (one list move for the call)."""
        linked: list[int] = []
        try:
            self._insert_pinned(keys, values, linked)
        finally:
            if linked:
                self._link_new(linked)

    def _link_new(self, linked: list[int]) -> None:
        """Link the new pinned entries of `linked` as the newest of T1 (P1), in
        order; empty it."""
        self._move(self._where, self._prev, self._next, linked, _NEW_PINNED, self._heads)
        self._np1 += len(linked)
        linked.clear()

    def _insert_pinned(
        self, keys: Iterable[Hashable], values: Iterable[Any], linked: list[int]
    ) -> None:
        index, klist, where, ghosts = self._index, self._keys, self._where, self._ghosts
        find, discard, limit = ghosts.find, ghosts.discard, self._slots
        in_place = self.pinned_in_place
        count = 0
        for key, slot in zip(keys, values, strict=True):
            if key in index or type(slot) is not int or not 0 <= slot < limit:
                if linked:  # the new entries before it are older
                    self._link_new(linked)
                self.insert(key, slot)  # a use (or the error) as `insert` gives it
                self.pin(key)
                continue
            if in_place:  # linked below, all at once: the newest of T1, pinned
                found = find(hash(key))
                if found:
                    self._adapt(hash(key), found)
                elif ghosts.len1 and self._n1 + self._np1 + len(linked) + 1 + ghosts.len1 > self._c:
                    ghosts.pop_oldest(1)  # as `_insert_in_place`
                index[key] = slot
                klist[slot] = key
                linked.append(slot)
                count += 1
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
        if self.pinned_in_place:
            return self._trim_ghosts(self._evict_in_place(n))
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
        return self._trim_ghosts(victims)

    def _trim_ghosts(self, victims: list[tuple[Hashable, Any]]) -> list[tuple[Hashable, Any]]:
        """Drop the oldest ghosts beyond the bounds (as ARCPolicy.evict_items)."""
        ghosts = self._ghosts
        c = self._c = self.capacity or max(self._c, len(self._index) + len(victims))
        while ghosts.len1 and self._n1 + self._np1 + ghosts.len1 > c:
            ghosts.pop_oldest(1)
        while ghosts.len1 + ghosts.len2 > c:
            ghosts.pop_oldest(2 if ghosts.len2 else 1)
        return victims

    def _evict_in_place(self, n: int) -> list[tuple[Hashable, Any]]:
        """`evict_items` with in-place pins: ARC's choice of list, each list walked
        from its front list's oldest entry; the pinned entries met are unlinked
        (passed)."""
        keys, index, where, add = self._keys, self._index, self._where, self._ghosts.add
        nxt, prev, p = self._next, self._prev, self.p
        n1, n2, np1 = self._n1, self._n2, self._np1
        victims: list[tuple[Hashable, Any]] = []
        passed = 0
        while len(victims) < n:
            if n1 and (n1 + np1 > p or not n2):
                which, head, last, pinned, mark = 1, self._f1, self._h1, _P1, _D1
                n1 -= 1
            elif n2:
                which, head, last, pinned, mark = 2, self._f2, self._h2, _P2, _D2
                n2 -= 1
            else:
                break
            slot = nxt[head]
            while True:  # an unpinned entry is in the front or the main list
                if slot == head:
                    assert head != last, "ARC's counts do not match its lists"
                    head = last
                    slot = nxt[head]
                    continue
                before, after = prev[slot], nxt[slot]
                nxt[before] = after
                prev[after] = before
                if where[slot] != pinned:
                    break
                where[slot] = mark
                passed += 1
                slot = after
            key = keys[slot]
            del index[key]  # first: a C index finds the entry through keys
            where[slot] = 0
            keys[slot] = None
            add(which, hash(key))
            victims.append((key, slot))
        self._n1, self._n2 = n1, n2
        self.examined += len(victims) + passed
        return victims

    def remove(self, key: Hashable) -> None:
        slot = self._index.pop(key, None)
        if slot is None:
            return
        self._keys[slot] = None
        where = self._where[slot]
        self._where[slot] = 0
        if self.pinned_in_place:
            if where not in (_D1, _D2):
                self._unlink(slot)
            if where in (_T1, _F1):
                self._n1 -= 1
            elif where in (_T2, _F2):
                self._n2 -= 1
            elif where in (_P1, _D1):
                self._np1 -= 1
            return
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
        return slot is not None and self._where[slot] in _PINNED_MARKS

    def _list(self, *heads: int) -> list[Hashable | None]:
        """The unpinned keys of the lists of `heads`, in that order, oldest first."""
        out = []
        nxt, keys, where = self._next, self._keys, self._where
        for head in heads:
            slot = nxt[head]
            while slot != head:
                if where[slot] not in _PINNED_MARKS:
                    out.append(keys[slot])
                slot = nxt[slot]
        return out

    def export(self) -> list[Any]:
        """As `ARCPolicy.export`: the eviction order if nothing were used again,
        then pinned keys (those of T1 first)."""
        t1 = self._list(self._f1, self._h1)
        first = len(t1)
        if self._n2:
            first = max(0, math.ceil(len(t1) + self._np1 - self.p))
        where = self._where
        p1 = [k for k, s in self._index.items() if where[s] in (_P1, _D1)]
        p2 = [k for k, s in self._index.items() if where[s] in (_P2, _D2)]
        return [*t1[:first], *self._list(self._f2, self._h2), *t1[first:], *p1, *p2]
