"""`TierEvents`: how a tier tells the manager that blocks left it.

A tier calls `removed(keys)` from any of its threads when blocks leave it (evicted,
found corrupt, deleted); the manager turns them into `removed` events naming the
tier, so a cache-aware router keeps an exact view of every tier. Nothing is kept
unless the manager enabled events (`enable()`), so a tier may report freely.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kvtiers.contract.keys import BlockKey

#: removals kept between two reads before the oldest are dropped (and counted)
MAX_PENDING = 1 << 20


class TierEvents:
    """Thread-safe (deque appends and pops are atomic); never blocks."""

    __slots__ = ("_enabled", "_pending", "dropped")

    def __init__(self) -> None:
        self._enabled = False
        self._pending: deque[BlockKey] = deque(maxlen=MAX_PENDING)
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        return self._enabled

    def enable(self) -> None:
        """Start keeping removals (the manager calls it when events are on)."""
        self._enabled = True

    def removed(self, keys: Iterable[BlockKey]) -> None:
        """`keys` are no longer held by the tier. Any thread; O(len(keys))."""
        if not self._enabled:
            return
        pending = self._pending
        for key in keys:
            if len(pending) == MAX_PENDING:
                self.dropped += 1
            pending.append(key)

    def take(self) -> list[BlockKey]:
        """The removals reported since the last call, oldest first."""
        out: list[BlockKey] = []
        pending = self._pending
        while pending:
            try:
                out.append(pending.popleft())
            except IndexError:  # emptied by a concurrent take
                break
        return out
