"""Errors counted by kind and logged once per kind, scrubbed of credentials: a
server that went away must not flood the log with one line per block, and no line
may carry a password."""

from __future__ import annotations

import logging
import threading
from collections import Counter

from kvtiers_redis.settings import RedisSettings

__all__ = ["ErrorLog"]


class ErrorLog:
    """Thread-safe. `counts` maps "op.kind" ("load.ConnectionError",
    "load.foreign") to a count; the first of each kind is logged (warning)."""

    def __init__(self, logger: logging.Logger, where: str, settings: RedisSettings):
        self._log = logger
        self._where = where
        self._settings = settings
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.counts: Counter[str] = Counter()

    def record(self, op: str, exc: BaseException) -> None:
        self.note(op, type(exc).__name__, f"{op} failed: {type(exc).__name__}: {exc}")

    def note(self, op: str, what: str, message: str) -> None:
        """A problem that is not an exception (a value of another format)."""
        kind = f"{op}.{what}"
        with self._lock:
            self.counts[kind] += 1
            first = kind not in self._seen
            self._seen.add(kind)
        if first:
            self._log.warning("kvtiers-redis %s (%s): %s (logged once; later %s are only "
                              "counted, see stats().errors)", self._where,
                              self._settings.address, self._settings.scrub(message), kind)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)
