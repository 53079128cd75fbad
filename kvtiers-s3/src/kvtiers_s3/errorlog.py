"""Errors counted by kind and logged once per kind, scrubbed of credentials: a
server that went away must not flood the log with one line per block, nor any
line carry a secret."""

from __future__ import annotations

import logging
import threading
from collections import Counter

from kvtiers_s3.objects import describe
from kvtiers_s3.settings import S3Settings


class ErrorLog:
    """Thread-safe. `counts` maps "op.kind" ("load.EndpointConnectionError",
    "load.corrupt") to a count; the first of each kind is logged (warning)."""

    def __init__(self, logger: logging.Logger, where: str, settings: S3Settings):
        self._log = logger
        self._where = where
        self._settings = settings
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.counts: Counter[str] = Counter()

    def record(self, op: str, exc: BaseException) -> None:
        self._count(f"{op}.{type(exc).__name__}", f"{op} failed: {describe(exc, self._settings)}")

    def note(self, op: str, what: str, message: str) -> None:
        """A problem that is not an exception (a corrupt object)."""
        self._count(f"{op}.{what}", self._settings.scrub(message))

    def _count(self, kind: str, message: str) -> None:
        with self._lock:
            self.counts[kind] += 1
            first = kind not in self._seen
            self._seen.add(kind)
        if first:
            self._log.warning("kvtiers-s3 %s: %s (logged once; later %s are only counted, "
                              "see stats().errors)", self._where, message, kind)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)
