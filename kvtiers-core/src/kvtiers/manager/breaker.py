"""A per-tier circuit breaker on the injectable clock.

A tier whose jobs fail (I/O errors, timeouts) `failures` times in a row is opened:
skipped for lookups, promotions and cascades for `cooldown_s`. Then it is half-open:
work is allowed again and the next job result closes it (success) or opens it again
(failure). Misses and corrupt blocks are data, not tier health: they do not count.
"""

from __future__ import annotations

import enum

from kvtiers.contract.clock import Clock


# Not enum.StrEnum (3.11+): kvtiers-core supports Python 3.10.
class BreakerState(str, enum.Enum):  # noqa: UP042
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, clock: Clock, failures: int = 5, cooldown_s: float = 10.0):
        if failures < 1:
            raise ValueError("failures must be >= 1")
        self._clock = clock
        self.threshold = failures
        self.cooldown_s = cooldown_s
        self._consecutive = 0
        self._open_until: float | None = None
        self.opened = 0  # times it opened, for stats

    @property
    def state(self) -> BreakerState:
        if self._open_until is None:
            return BreakerState.CLOSED
        if self._clock() < self._open_until:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def allows(self) -> bool:
        """May the tier be used now? False only while open."""
        return self._open_until is None or self._clock() >= self._open_until

    def success(self) -> None:
        self._consecutive = 0
        self._open_until = None

    def failure(self) -> None:
        self._consecutive += 1
        half_open = self._open_until is not None and self._clock() >= self._open_until
        if half_open or self._consecutive >= self.threshold:
            self._open_until = self._clock() + self.cooldown_s
            self.opened += 1
