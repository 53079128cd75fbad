"""SIEVE for a CPU pool whose values are slot numbers: `SievePolicy`'s algorithm
(same victims, same order, same `examined`) laid out like `SlotLRUPolicy`.

`SievePolicy` keeps the queue as two ordered dicts, `_ahead` (not yet reached by the
hand in this sweep) and `_behind` (survivors it passed). Here the queue is one doubly
linked list threaded through int32 arrays indexed by slot, oldest first, `behind`
then `ahead`; the hand is the slot where `ahead` starts (the sentinel when `ahead` is
empty). A key -> slot index (`slot_index`: the C table or a compact dict), a slot ->
key list and one byte each for "visited" and "pinned" complete it: ~28 bytes per
entry with the C index, ~70 with the dict, where the ordered dicts and the visited
set cost ~300 under churn.

Pinned entries are unlinked (their visited byte stays), so the hand never meets them:
eviction is O(1) amortised per victim whatever share is pinned.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, ClassVar

from kvtiers.policies.slot_index import SlotIndexPolicy


class SlotSievePolicy(SlotIndexPolicy):
    """SIEVE over values that are slot numbers in `0..capacity-1` (each used by at
    most one entry at a time)."""

    name: ClassVar[str] = "sieve"
    restores_as: ClassVar[str] = "a SievePolicy"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        assert capacity is not None
        head = capacity  # sentinel: next[head] is the oldest, prev[head] the newest
        self._head = head
        self._hand = head  # where `ahead` starts; the sentinel: `ahead` is empty
        self._init_links(1)
        self._visited = bytearray(capacity)
        self._pinned = bytearray(capacity)
        self.pinned_count = 0

    def _link_newest(self, slot: int) -> None:
        """Append `slot` at the newest end: the end of `ahead`."""
        head = self._head
        self._append(head, slot)
        if self._hand == head:  # `ahead` was empty: it starts here now
            self._hand = slot

    def _unlink(self, slot: int) -> None:
        if self._hand == slot:  # the hand moves on to the next entry
            self._hand = self._next[slot]
        super()._unlink(slot)

    def insert(self, key: Hashable, value: Any = None) -> None:
        index = self._index
        slot = index.get(key)
        if slot is not None:
            self._visited[slot] = 1
            return
        self._check_slot(value)
        index[key] = value
        self._keys[value] = key
        self._visited[value] = 0
        self._link_newest(value)
        self._count_inserts()

    def touch(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is not None:
            self._visited[slot] = 1

    def touch_many(self, keys: Iterable[Hashable]) -> None:
        visited = self._visited
        for slot in map(self._index.get, keys):
            if slot is not None:
                visited[slot] = 1

    def pin(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None or self._pinned[slot]:
            return
        self._pinned[slot] = 1
        self.pinned_count += 1
        self._unlink(slot)

    def unpin(self, key: Hashable) -> None:
        slot = self._index.get(key)
        if slot is None or not self._pinned[slot]:
            return
        self._pinned[slot] = 0
        self.pinned_count -= 1
        self._link_newest(slot)

    def evict_items(self, n: int = 1) -> list[tuple[Hashable, Any]]:
        head, prev, nxt = self._head, self._prev, self._next
        keys, index, visited = self._keys, self._index, self._visited
        victims: list[tuple[Hashable, Any]] = []
        hand = self._hand
        passed = 0
        while len(victims) < n:
            if hand == head:
                hand = nxt[head]  # the hand wraps to the oldest entry
                if hand == head:
                    break  # nothing unpinned
            if visited[hand]:
                visited[hand] = 0
                passed += 1
                hand = nxt[hand]
                continue
            slot = hand
            hand = nxt[slot]
            p = prev[slot]
            nxt[p] = hand
            prev[hand] = p
            key = keys[slot]
            del index[key]  # first: a C index finds the entry through keys
            keys[slot] = None
            victims.append((key, slot))
        self._hand = hand
        self.examined += len(victims) + passed
        return victims

    def remove(self, key: Hashable) -> None:
        slot = self._index.pop(key, None)
        if slot is None:
            return
        self._keys[slot] = None
        self._visited[slot] = 0
        if self._pinned[slot]:
            self._pinned[slot] = 0
            self.pinned_count -= 1
        else:
            self._unlink(slot)

    def is_pinned(self, key: Hashable) -> bool:
        slot = self._index.get(key)
        return slot is not None and bool(self._pinned[slot])

    def _queue(self, start: int, stop: int) -> list[int]:
        out = []
        nxt = self._next
        slot = start
        while slot != stop:
            out.append(slot)
            slot = nxt[slot]
        return out

    def export(self) -> list[Any]:
        """As `SievePolicy.export`: unvisited entries ahead of the hand, unvisited
        behind it, visited ahead, visited behind, then pinned keys."""
        head, keys, visited = self._head, self._keys, self._visited
        behind = self._queue(self._next[head], self._hand)
        ahead = self._queue(self._hand, head)
        order = [
            *(s for s in ahead if not visited[s]),
            *(s for s in behind if not visited[s]),
            *(s for s in ahead if visited[s]),
            *(s for s in behind if visited[s]),
        ]
        pinned = self._pinned
        return [keys[s] for s in order] + [k for k, s in self._index.items() if pinned[s]]
