"""`Breaker`: the tier fails fast while the master (or a segment owner) is away.

Closed, every call goes through. A call that fails for the store's reasons (the
master does not answer, a transfer to a segment fails) opens it: for `retry_s`
on the tier's clock the tier refuses its calls at once (`REJECTED`, a miss),
instead of waiting for Mooncake's own time-outs on every unit of every job.
Then one call at a time is let through (half-open); its success closes the
breaker and is reported as a recovery, its failure opens it again. Thread-safe;
O(1); never blocks.
"""

from __future__ import annotations

import threading

from kvtiers.sdk import Clock

__all__ = ["Breaker"]


class Breaker:
    def __init__(self, clock: Clock, retry_s: float):
        self._clock = clock
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._open_until: float | None = None  # None: closed
        self._trying = False  # a half-open call is out
        self.opened = 0  # times it opened (stats, tests)
        self.recovered = 0  # times a call succeeded after it had opened

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def allow(self) -> bool:
        """Whether a call may go out now (closed; or half-open and none is out)."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._trying or self._clock() < self._open_until:
                return False
            self._trying = True
            return True

    def failed(self) -> None:
        with self._lock:
            if self._open_until is None:
                self.opened += 1
            self._open_until = self._clock() + self._retry_s
            self._trying = False

    def succeeded(self) -> bool:
        """Close it; True when this ended an outage (the caller reconciles)."""
        with self._lock:
            was_open = self._open_until is not None
            self._open_until = None
            self._trying = False
            if was_open:
                self.recovered += 1
            return was_open

    def settle(self) -> None:
        """A call let through ended neither way (nothing learnt): let another try."""
        with self._lock:
            self._trying = False
