"""Adaptive replacement cache (Megiddo & Modha, FAST '03).

Resident entries live in T1 (seen once) or T2 (seen again since they came in), each
an ordered dict, oldest first. B1 and B2 remember recently evicted T1 and T2 entries
("ghosts"). A new key that hits B1 means T1 was too small: the target size `p` of
T1 grows; a hit in B2 shrinks it. Eviction takes T1's oldest entry while T1 is above
its target, else T2's: one look per victim.

Differences from the paper, because the owner (not the policy) decides when to evict:
- `evict(n)` applies the paper's REPLACE n times without knowing the key about to
  come in, so the "incoming key is in B2 and |T1| == p" tie goes to T2.
- Ghost lists hold |T1| + |B1| <= c and |B1| + |B2| <= c (oldest ghosts dropped
  first), with c the `capacity` or, when that is None, the most entries ever held
  when `evict` was called. Ghosts hold `hash(key)`, not the key, so an evicted key
  object is freed; a 64-bit hash collision only misguides adaptation once.
- Pinning moves an entry out of T1/T2 into P1/P2 (plain dicts, never walked), so
  it keeps its list; a use while pinned moves it from P1 to P2. Pinned T1 entries
  still count toward |T1| when comparing with `p`, so pins do not skew the
  adaptation. Unpinning puts the entry back as the newest of its list.

Each entry carries the value given to `insert` (the pool's slot).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterable
from operator import itemgetter
from typing import Any, ClassVar

from kvtiers.contract.eviction import EvictionPolicy

_MISSING: Any = object()
_KEY = itemgetter(0)


class ARCPolicy(EvictionPolicy):
    name: ClassVar[str] = "arc"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        self._t1: OrderedDict[Hashable, Any] = OrderedDict()  # key -> value, oldest first
        self._t2: OrderedDict[Hashable, Any] = OrderedDict()
        self._p1: dict[Hashable, Any] = {}  # pinned entries of T1
        self._p2: dict[Hashable, Any] = {}  # pinned entries of T2
        self._b1: OrderedDict[int, None] = OrderedDict()  # hash(key), oldest first
        self._b2: OrderedDict[int, None] = OrderedDict()
        self.p = 0.0  # target size of T1, in 0..c
        self._c = capacity or 0

    @classmethod
    def for_slots(cls, num_slots: int) -> EvictionPolicy:
        from kvtiers.policies.slot_arc import SlotARCPolicy

        return SlotARCPolicy(num_slots)

    def insert(self, key: Hashable, value: Any = None) -> None:
        """Add `key` with `value`; a key already present is only touched (its value
        is kept). A key remembered by a ghost list adapts `p` and goes to T2."""
        if key in self._t1 or key in self._t2 or key in self._p1 or key in self._p2:
            self.touch(key)
            return
        ghost = hash(key)
        b1, b2 = self._b1, self._b2
        if ghost in b1:  # evicted from T1 too early: give T1 more room
            self.p = min(self._c, self.p + max(1.0, len(b2) / len(b1)))
            del b1[ghost]
            self._t2[key] = value
        elif ghost in b2:  # evicted from T2 too early: give T2 more room
            self.p = max(0.0, self.p - max(1.0, len(b1) / len(b2)))
            del b2[ghost]
            self._t2[key] = value
        else:
            self._t1[key] = value
            if b1 and len(self._t1) + len(self._p1) + len(b1) > self._c:
                b1.popitem(last=False)  # the paper's |T1| + |B1| <= c, kept on arrival

    def touch(self, key: Hashable) -> None:
        if key in self._t1:
            self._t2[key] = self._t1.pop(key)
        elif key in self._t2:
            self._t2.move_to_end(key)
        elif key in self._p1:
            self._p2[key] = self._p1.pop(key)

    def reorder_many(self, keys: Iterable[Hashable], used: Container[Hashable] = ()) -> None:
        """A key of `used` is touched; the others move to the newest end of their
        own list (pinned ones stay out of the lists)."""
        for key in keys:
            if key in used:
                self.touch(key)
            elif key in self._t1:
                self._t1.move_to_end(key)
            elif key in self._t2:
                self._t2.move_to_end(key)

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._t1.get(key, _MISSING)
        if value is _MISSING:
            value = self._t2.get(key, _MISSING)
            if value is _MISSING:
                value = self._p1.get(key, _MISSING)
                if value is _MISSING:
                    return self._p2.get(key, default)
        return value

    def pin(self, key: Hashable) -> None:
        if key in self._t1:
            self._p1[key] = self._t1.pop(key)
        elif key in self._t2:
            self._p2[key] = self._t2.pop(key)

    def unpin(self, key: Hashable) -> None:
        if key in self._p1:
            self._t1[key] = self._p1.pop(key)
        elif key in self._p2:
            self._t2[key] = self._p2.pop(key)

    def evict_items(self, n: int = 1) -> list[tuple[Hashable, Any]]:
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        pinned_t1, p = len(self._p1), self.p
        victims: list[tuple[Hashable, Any]] = []
        while len(victims) < n:
            if t1 and (len(t1) + pinned_t1 > p or not t2):
                item = t1.popitem(last=False)
                b1[hash(item[0])] = None
            elif t2:
                item = t2.popitem(last=False)
                b2[hash(item[0])] = None
            else:
                break
            victims.append(item)
        self.examined += len(victims)
        c = self._c = self.capacity or max(self._c, len(self) + len(victims))
        # Drop the oldest ghosts beyond the bounds; each ghost is added and dropped
        # once, so this is O(1) amortised per eviction.
        while b1 and len(t1) + pinned_t1 + len(b1) > c:
            b1.popitem(last=False)
        while len(b1) + len(b2) > c:
            (b2 or b1).popitem(last=False)
        return victims

    def evict(self, n: int = 1) -> list[Hashable]:
        return list(map(_KEY, self.evict_items(n)))  # no per-call comprehension frame

    def remove(self, key: Hashable) -> None:
        for table in (self._t1, self._t2, self._p1, self._p2):
            if table.pop(key, _MISSING) is not _MISSING:
                return

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2 or key in self._p1 or key in self._p2

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2) + len(self._p1) + len(self._p2)

    def is_pinned(self, key: Hashable) -> bool:
        return key in self._p1 or key in self._p2

    def export(self) -> list[Any]:
        """The order in which `evict` would take every unpinned entry if nothing were
        used again (T1's oldest while T1 is above `p`, then T2, then the rest of T1),
        then pinned entries. `restore` inserts them all into T1 with p = 0, which
        evicts in exactly that order; which entries were in T2, `p`, the ghosts and
        the values are not kept (the first three are learned again)."""
        t1 = list(self._t1)
        first = len(t1)
        if self._t2:
            first = max(0, math.ceil(len(t1) + len(self._p1) - self.p))
        return [*t1[:first], *self._t2, *t1[first:], *self._p1, *self._p2]
