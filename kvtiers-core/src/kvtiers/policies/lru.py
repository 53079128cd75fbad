"""Least recently used.

Unpinned entries sit in an ordered dict, oldest first; eviction pops from the front.
Pinning moves an entry out of that dict into `_pinned`, so eviction never walks a
pinned entry. Unpinning puts the entry back as most recent: it was just in use.

Each entry carries the value given to `insert` (the pool keeps its slot there, so one
structure per block serves as both index and recency). Memory: one OrderedDict entry
per unpinned key, one dict entry per pinned key; no per-entry objects of our own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Iterable
from operator import itemgetter
from typing import Any, ClassVar

from kvtiers.contract.eviction import EvictionPolicy

_MISSING: Any = object()
_KEY = itemgetter(0)


class LRUPolicy(EvictionPolicy):
    name: ClassVar[str] = "lru"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        self._order: OrderedDict[Hashable, Any] = OrderedDict()
        # A dict rather than a set: it holds values and keeps pin order for `export`.
        self._pinned: dict[Hashable, Any] = {}

    @classmethod
    def for_slots(cls, num_slots: int) -> EvictionPolicy:
        from kvtiers.policies.slot_lru import SlotLRUPolicy

        return SlotLRUPolicy(num_slots)

    def insert(self, key: Hashable, value: Any = None) -> None:
        """Add `key` with `value`; a key already present is only touched (its value
        is kept)."""
        order = self._order
        if key in order:
            order.move_to_end(key)
        elif key not in self._pinned:  # a pinned key: unpinning will make it newest
            order[key] = value

    def touch(self, key: Hashable) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def reorder_many(self, keys: Iterable[Hashable], used: Container[Hashable] = ()) -> None:
        """In LRU a use is recency alone: every key is touched."""
        self.touch_many(keys)

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._order.get(key, _MISSING)
        return self._pinned.get(key, default) if value is _MISSING else value

    def pin(self, key: Hashable) -> None:
        value = self._order.pop(key, _MISSING)
        if value is not _MISSING:
            self._pinned[key] = value

    def unpin(self, key: Hashable) -> None:
        value = self._pinned.pop(key, _MISSING)
        if value is not _MISSING:
            self._order[key] = value

    # The batch calls: the same steps as the loops over single calls, without a
    # method call per key (a tier pins, unpins and touches a job's keys at once).

    def pin_many(self, keys: Iterable[Hashable]) -> None:
        pop, pinned = self._order.pop, self._pinned
        for key in keys:
            value = pop(key, _MISSING)
            if value is not _MISSING:
                pinned[key] = value

    def unpin_many(self, keys: Iterable[Hashable]) -> None:
        pop, order = self._pinned.pop, self._order
        for key in keys:
            value = pop(key, _MISSING)
            if value is not _MISSING:
                order[key] = value

    def touch_many(self, keys: Iterable[Hashable]) -> None:
        order = self._order
        move = order.move_to_end
        for key in keys:
            if key in order:
                move(key)

    def insert_pinned(self, keys: Iterable[Hashable], values: Iterable[Any]) -> None:
        """The keys are absent (the contract): each goes straight to `_pinned`."""
        pinned = self._pinned
        for key, value in zip(keys, values, strict=True):
            pinned[key] = value

    def evict_items(self, n: int = 1) -> list[tuple[Hashable, Any]]:
        order = self._order
        victims: list[tuple[Hashable, Any]] = []
        while order and len(victims) < n:
            victims.append(order.popitem(last=False))
        self.examined += len(victims)
        return victims

    def evict(self, n: int = 1) -> list[Hashable]:
        return list(map(_KEY, self.evict_items(n)))  # no per-call comprehension frame

    def remove(self, key: Hashable) -> None:
        self._order.pop(key, None)
        self._pinned.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._order or key in self._pinned

    def __len__(self) -> int:
        return len(self._order) + len(self._pinned)

    def is_pinned(self, key: Hashable) -> bool:
        return key in self._pinned

    def export(self) -> list[Any]:
        """Victim order (oldest first), then pinned entries in pin order: restoring
        them reproduces the eviction order exactly, pinned entries coming back as
        the most recent, as unpinning would make them. Values are not exported."""
        return [*self._order, *self._pinned]
