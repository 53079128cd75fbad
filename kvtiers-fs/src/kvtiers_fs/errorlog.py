"""Errors the fs tier meets are counted by kind and logged once per kind: a full
disk or a vanished root must not flood the log with one line per block."""

from __future__ import annotations

import errno
import logging
import threading
from collections import Counter


def errno_name(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return errno.errorcode.get(code, str(code))
    return type(exc).__name__


class ErrorLog:
    """Thread-safe. `counts` maps "op.ERRNO" (e.g. "store.ENOSPC") to a count."""

    def __init__(self, logger: logging.Logger, where: str):
        self._log = logger
        self._where = where
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.counts: Counter[str] = Counter()

    def record(self, op: str, exc: BaseException, detail: str = "") -> None:
        kind = f"{op}.{errno_name(exc)}"
        with self._lock:
            self.counts[kind] += 1
            first = kind not in self._seen
            self._seen.add(kind)
        if first:
            self._log.warning(
                "kvtiers-fs %s: %s failed: %s%s (logged once; later %s errors are only "
                "counted, see stats().errors)",
                self._where, op, exc, f" [{detail}]" if detail else "", kind,
            )

    def note(self, op: str, what: str, message: str) -> None:
        """Count and log once a problem that is not an exception (a corrupt file)."""
        kind = f"{op}.{what}"
        with self._lock:
            self.counts[kind] += 1
            first = kind not in self._seen
            self._seen.add(kind)
        if first:
            self._log.warning("kvtiers-fs %s: %s (logged once per kind)", self._where, message)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)
