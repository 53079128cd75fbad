"""Least recently used. Unpinned entries sit in an ordered dict (oldest first);
pinning moves an entry out of it, so eviction pops from the front without ever
walking pinned entries. Unpinning puts the entry back as most recent: it was in use."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, ClassVar

from kvtiers.policies.base import EvictionPolicy


class LRUPolicy(EvictionPolicy):
    name: ClassVar[str] = "lru"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        self._order: OrderedDict[Hashable, None] = OrderedDict()
        self._pinned: set[Hashable] = set()

    def insert(self, key: Hashable) -> None:
        if key in self._pinned:
            return
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: Hashable) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def pin(self, key: Hashable) -> None:
        if key in self._order:
            del self._order[key]
            self._pinned.add(key)

    def unpin(self, key: Hashable) -> None:
        if key in self._pinned:
            self._pinned.discard(key)
            self._order[key] = None

    def evict(self, n: int = 1) -> list[Hashable]:
        victims: list[Hashable] = []
        order = self._order
        while order and len(victims) < n:
            key, _ = order.popitem(last=False)
            victims.append(key)
        self.examined += len(victims)
        return victims

    def remove(self, key: Hashable) -> None:
        self._order.pop(key, None)
        self._pinned.discard(key)

    def __contains__(self, key: object) -> bool:
        return key in self._order or key in self._pinned

    def __len__(self) -> int:
        return len(self._order) + len(self._pinned)

    def is_pinned(self, key: Hashable) -> bool:
        return key in self._pinned

    def export(self) -> list[Any]:
        return [*self._order, *self._pinned]
