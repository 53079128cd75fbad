"""`ErrorCounts`: the problems a tier meets, counted by kind and logged once per
kind. A server that went away or a full disk must not flood the log with one line
per block; the counts go to the tier's `stats().errors`. `scrub` removes what must
never reach a log line (credentials) from every message.

Thread-safe: any thread may count; one lock guards the counts (O(1) under it), the
log line is written outside it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

__all__ = ["ErrorCounts"]


def _same(message: str) -> str:
    return message


class ErrorCounts:
    """`count(kind, message)`: one more problem of `kind` ("op.what", e.g.
    "load.ConnectionError", "store.ENOSPC"); the first of each kind is logged as a
    warning, `prefix: message`, scrubbed. `snapshot()`: the counts, a copy."""

    def __init__(self, logger: logging.Logger, prefix: str, *,
                 scrub: Callable[[str], str] = _same):
        self._log = logger
        self._prefix = prefix
        self._scrub = scrub
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def count(self, kind: str, message: str) -> bool:
        """Count one problem of `kind`; True when it is the first of its kind (logged)."""
        with self._lock:
            first = kind not in self.counts
            self.counts[kind] += 1
        if first:
            self._log.warning("%s: %s (logged once; later %s are only counted, see "
                              "stats().errors)", self._prefix, self._scrub(message), kind)
        return first

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)
