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
- `reorder_many(keys, used)` moves keys to the newest end without counting every
  one as a use (the default touches the keys of `used` only);
- `keep_pinned_in_place()`, on an empty policy, asks for in-place pins (below);
  a policy without that mode returns False and changes nothing (the default).
`examined` counts entries a policy looked at while choosing victims, so tests can
prove the O(1) bound by counting rather than timing.

In-place pins (`pinned_in_place`): for an owner that reports every use itself (an
engine that commits a request's uses when the request ends) rather than letting a
transfer's end count as one. A pin no longer takes an entry out of the order: it
keeps its place, and unpinning does not refresh it. `touch` and `reorder_many` move
pinned entries like any other. New entries, pinned or not, are placed as the newest;
an insertion is not a use (ARC: a key its ghosts remember adapts `p` and still
enters T1). Eviction passes over the pinned entries it meets, taking each out of the
order (it was the oldest then); unpinned, such an entry comes back as the oldest.
Each pinned entry is passed over at most once per pin (counted in `examined`), so
eviction stays O(1) amortised per victim and per pin.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Hashable, Iterable
from typing import Any, ClassVar


class EvictionPolicy(ABC):
    name: ClassVar[str]
    #: whether pins keep entries in place (`keep_pinned_in_place`)
    pinned_in_place: bool = False

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

    def reorder_many(self, keys: Iterable[Hashable], used: Container[Hashable] = ()) -> None:
        """Move each key of `keys`, in order, to the newest end of the order (the last
        one given becomes the newest): a key in `used` as `touch` does (a use), the
        others by recency alone (ARC: within their list, T1 stays T1). Unknown keys
        are ignored. The default touches the keys of `used` and leaves the others."""
        self.touch_many([key for key in keys if key in used])

    def keep_pinned_in_place(self) -> bool:
        """Switch this policy, while it is empty, to in-place pins (see the module
        docstring); True when it did. The default: False, nothing changes."""
        return False

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
