"""SIEVE (Zhang et al., NSDI '24): a FIFO queue, one "visited" bit per entry and a
hand that walks from the oldest entry toward the newest. A use only sets the bit; the
hand clears set bits and passes over those entries, and evicts the first entry whose
bit is clear. New entries go in at the newest end, far from the hand.

Why SIEVE rather than S3-FIFO as the scan-resistant policy:
- memory: one ordered-dict entry per key (and a set entry per visited key), where
  S3-FIFO keeps a ghost queue as long as the main queue; a ghost holds its key
  object alive after eviction, which would roughly double the scheduler-side bytes
  per resident block;
- scan resistance: survivors stay in place behind the hand, so while inserts and
  evictions alternate the hand keeps working through the newest, never-reused entries
  and a one-time scan drains out without flushing a reused working set; S3-FIFO's
  small queue gives the same effect with three queues and counters to tune;
- a hit only sets a bit: nothing moves in the queue.

The hand over one queue is kept as two ordered dicts: `_ahead` holds the entries the
hand has not reached in this sweep (oldest first), `_behind` the survivors it has
passed (bits cleared, in queue order). The hand examines `_ahead`'s oldest entry;
when `_ahead` runs out the hand wraps and `_behind` becomes `_ahead`. Examining an
entry pops it, so each visited bit costs one look: eviction is O(1) amortised over
the `touch` calls that set the bits.

Visited bits live in a set of the keys that have one, so each entry can carry the
value given to `insert` (the pool's slot): one ordered-dict entry per key, plus a set
entry while its bit is set. Pinning moves an entry out of the queue (its bit stays),
so the hand never meets it. Unpinning puts it back at the newest end, bit kept: it
was held by a job, so it is as fresh as a new arrival, and a use recorded while
pinned still counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from operator import itemgetter
from typing import Any, ClassVar

from kvtiers.contract.eviction import EvictionPolicy

_MISSING: Any = object()
_KEY = itemgetter(0)


class SievePolicy(EvictionPolicy):
    name: ClassVar[str] = "sieve"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        self._ahead: OrderedDict[Hashable, Any] = OrderedDict()
        self._behind: OrderedDict[Hashable, Any] = OrderedDict()
        self._pinned: dict[Hashable, Any] = {}
        self._visited: set[Hashable] = set()

    @classmethod
    def for_slots(cls, num_slots: int) -> EvictionPolicy:
        from kvtiers.policies.slot_sieve import SlotSievePolicy

        return SlotSievePolicy(num_slots)

    def insert(self, key: Hashable, value: Any = None) -> None:
        """Add `key` with `value` at the newest end; a key already present is only
        touched (its value is kept)."""
        if key in self._ahead or key in self._behind or key in self._pinned:
            self._visited.add(key)
        else:
            self._ahead[key] = value

    def touch(self, key: Hashable) -> None:
        if key in self._ahead or key in self._behind or key in self._pinned:
            self._visited.add(key)

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._ahead.get(key, _MISSING)
        if value is _MISSING:
            value = self._behind.get(key, _MISSING)
            if value is _MISSING:
                return self._pinned.get(key, default)
        return value

    def pin(self, key: Hashable) -> None:
        value = self._ahead.pop(key, _MISSING)
        if value is _MISSING:
            value = self._behind.pop(key, _MISSING)
            if value is _MISSING:
                return  # unknown or already pinned
        self._pinned[key] = value

    def unpin(self, key: Hashable) -> None:
        value = self._pinned.pop(key, _MISSING)
        if value is not _MISSING:
            self._ahead[key] = value

    def evict_items(self, n: int = 1) -> list[tuple[Hashable, Any]]:
        victims: list[tuple[Hashable, Any]] = []
        ahead, visited = self._ahead, self._visited
        passed = 0
        while len(victims) < n:
            if not ahead:
                if not self._behind:
                    break
                # The hand wraps to the oldest entry: the survivors are all ahead again.
                self._ahead, self._behind = self._behind, ahead
                ahead = self._ahead
            item = ahead.popitem(last=False)  # (key, value), returned as is if a victim
            key = item[0]
            if key in visited:
                visited.remove(key)
                self._behind[key] = item[1]
                passed += 1
            else:
                victims.append(item)
        self.examined += len(victims) + passed
        return victims

    def evict(self, n: int = 1) -> list[Hashable]:
        return list(map(_KEY, self.evict_items(n)))  # no per-call comprehension frame

    def remove(self, key: Hashable) -> None:
        for table in (self._ahead, self._behind, self._pinned):
            if table.pop(key, _MISSING) is not _MISSING:
                break
        self._visited.discard(key)

    def __contains__(self, key: object) -> bool:
        return key in self._ahead or key in self._behind or key in self._pinned

    def __len__(self) -> int:
        return len(self._ahead) + len(self._behind) + len(self._pinned)

    def is_pinned(self, key: Hashable) -> bool:
        return key in self._pinned

    def export(self) -> list[Any]:
        """The order in which the hand would evict everything if nothing were used
        again: unvisited entries ahead of the hand, unvisited behind it, then the
        visited ones (their bits are cleared on this sweep, so they go on the next)
        in the same order, then pinned entries in pin order. `restore` inserts them
        with clear bits, which reproduces exactly that order; the bits themselves
        are folded into the order rather than kept. Values are not exported."""
        ahead, behind, visited = self._ahead, self._behind, self._visited
        return [
            *(k for k in ahead if k not in visited),
            *(k for k in behind if k not in visited),
            *(k for k in ahead if k in visited),
            *(k for k in behind if k in visited),
            *self._pinned,
        ]
