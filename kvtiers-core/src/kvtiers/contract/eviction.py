"""The eviction-policy interface used by the CPU pool and by any tier that wants one.

Contract (every policy; tested by one shared test class):
- `insert(key, value=None)` adds an unpinned entry carrying `value` (the CPU pool
  stores the slot there, so one structure per block serves as index and order); a
  key already present is only touched and keeps its value;
- `get(key, default=None)` returns the value of an entry, pinned or not;
- `touch(key)` records a use; `pin`/`unpin` take an entry out of / back into the
  candidates (boolean, not counted: callers keep reference counts);
- `evict_items(n)` removes and returns up to n unpinned `(key, value)` pairs, best
  victims first; `evict(n)` the same without values;
  fewer if fewer are unpinned; it never examines pinned entries, so its cost is
  O(1) per evicted entry (amortised at most) whatever share is pinned;
- `remove(key)` forgets an entry (pinned or not); unknown keys are ignored;
- `export()` returns recency state as a JSON-ready list (oldest first) that
  `restore()` accepts after a restart (persistent tiers).
- the batch forms `pin_many`, `unpin_many`, `touch_many` and `insert_pinned` do
  exactly what the single calls would, in order; a policy may override them with
  faster loops (the CPU pool's slot policies do).
`examined` counts entries a policy looked at while choosing victims, so tests can
prove the O(1) bound by counting rather than timing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable
from typing import Any, ClassVar


class EvictionPolicy(ABC):
    name: ClassVar[str]

    def __init__(self, capacity: int | None = None):
        """`capacity`: the number of entries the owner can hold, for policies that size
        internal queues by it (ARC, S3-FIFO). None means unknown."""
        self.capacity = capacity
        self.examined = 0

    @classmethod
    def for_slots(cls, num_slots: int) -> EvictionPolicy:
        """This policy for a CPU pool: values are slot numbers `0..num_slots-1`. A
        policy may return a variant laid out for that case (LRU does)."""
        return cls(capacity=num_slots)

    @abstractmethod
    def insert(self, key: Hashable, value: Any = None) -> None: ...

    @abstractmethod
    def get(self, key: Hashable, default: Any = None) -> Any: ...

    @abstractmethod
    def touch(self, key: Hashable) -> None: ...

    @abstractmethod
    def pin(self, key: Hashable) -> None: ...

    @abstractmethod
    def unpin(self, key: Hashable) -> None: ...

    @abstractmethod
    def evict_items(self, n: int = 1) -> list[tuple[Hashable, Any]]: ...

    def evict(self, n: int = 1) -> list[Hashable]:
        return [key for key, _ in self.evict_items(n)]

    @abstractmethod
    def remove(self, key: Hashable) -> None: ...

    def pin_many(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self.pin(key)

    def unpin_many(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self.unpin(key)

    def touch_many(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self.touch(key)

    def insert_pinned(self, keys: Iterable[Hashable], values: Iterable[Any]) -> None:
        """`insert(key, value)` then `pin(key)` for each pair; the keys are absent."""
        for key, value in zip(keys, values, strict=True):
            self.insert(key, value)
            self.pin(key)

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def is_pinned(self, key: Hashable) -> bool: ...

    @abstractmethod
    def export(self) -> list[Any]:
        """Entries oldest first, as JSON-ready values (keys as given)."""

    def restore(self, state: Iterable[Any]) -> None:
        """Re-insert exported entries, oldest first, into an empty policy."""
        for key in state:
            self.insert(key)
