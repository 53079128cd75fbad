"""Clocks: the manager and every tier take a monotonic-time function, so deadlines,
breakers and TTLs are tested by moving a `ManualClock` instead of sleeping."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Clock = Callable[[], float]

monotonic: Clock = time.monotonic


class ManualClock:
    """A clock that only moves when told to. Thread-safe; callable like `time.monotonic`."""

    def __init__(self, start: float = 1000.0):
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        with self._lock:
            self._now += seconds
            return self._now
