"""`EventLog`: the stored/removed notifications a cache-aware router reads.

Off unless someone reads them (`enable()`, the manager's `enable_events`, the
config's `enable_kv_events`): an engine that never calls `take_events()` must not
grow memory or keep evicted keys alive. When on, every event is kept until
`take()`.

Removals that secondary tiers report (from their own threads) through their
`TierContext.events` are turned into `removed` events naming the tier by
`collect()`, which the manager runs in `step()` and `take_events()`. Scheduler
thread (under the manager's lock); nothing here blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from kvtiers.contract.events import TierEvents
from kvtiers.contract.keys import BlockKey
from kvtiers.manager.outputs import CPU, OffloadEvent

_log = logging.getLogger("kvtiers.manager")


class EventLog:
    __slots__ = ("_enabled", "_events", "_listeners", "_tiers")

    def __init__(self, enabled: bool = False):
        self._enabled = False
        self._events: list[OffloadEvent] = []
        self._tiers: list[tuple[str, TierEvents]] = []
        # Told of every removal from the pool, events on or off (`listen`).
        self._listeners: list[Callable[[Sequence[BlockKey]], None]] = []
        if enabled:
            self.enable()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def enable(self) -> None:
        """Keep events from now on, the tiers' removals too."""
        self._enabled = True
        for _, reporter in self._tiers:
            reporter.enable()

    def watch(self, tier: str, reporter: TierEvents) -> None:
        """Turn what `reporter` (a tier's `ctx.events`) reports into events of `tier`."""
        if any(r is reporter for _, r in self._tiers):
            return  # a wrapper and the tier it wraps share one context's reporter
        self._tiers.append((tier, reporter))
        if self._enabled:
            reporter.enable()

    def listen(self, listener: Callable[[Sequence[BlockKey]], None]) -> None:
        """Call `listener(keys)` with the keys of every removal from the pool, as it
        happens (`ParentManager.watch_removals`), events on or off."""
        self._listeners.append(listener)

    def stored(self, keys: list[BlockKey], tier: str = CPU, source: str | None = None) -> None:
        """`keys` (a list the caller gives away) became readable from `tier`."""
        if self._enabled and keys:
            self._events.append(OffloadEvent("stored", keys, tier, source))

    def removed(self, keys: list[BlockKey], tier: str = CPU) -> None:
        """`keys` (a list the caller gives away) left `tier`."""
        if self._listeners and tier == CPU and keys:
            for listener in self._listeners:
                try:
                    listener(keys)
                except Exception:  # noqa: BLE001 - a listener's bug must not stop evictions
                    _log.exception("a removal listener raised; ignored")
        if self._enabled and keys:
            self._events.append(OffloadEvent("removed", keys, tier))

    def collect(self) -> None:
        """Take the removals the tiers reported since the last call. O(removals)."""
        if not self._enabled:
            return
        for tier, reporter in self._tiers:
            keys = reporter.take()
            if keys:
                self._events.append(OffloadEvent("removed", keys, tier))

    def take(self) -> list[OffloadEvent]:
        """Every event since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def pending(self) -> list[OffloadEvent]:
        """The events `take()` would return, left in place (checks, tests)."""
        return list(self._events)
