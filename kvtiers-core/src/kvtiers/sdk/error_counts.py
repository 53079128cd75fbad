"""`ErrorCounts`: the problems a tier meets, counted by kind and logged once per
kind. A server that went away or a full disk must not flood the log with one line
per block; the counts go to the tier's `stats().errors`. `scrub` removes what must
never reach a log line (credentials) from every message.

A tier counts a failed operation with `record(op, exc)` and a problem that is not
an exception (a corrupt file) with `note(op, what, message)`; how an exception is
named in its kind (`kind`: the errno's name, ENOSPC, where it has one, else the
exception's class) and in its message (`describe`) are the tier's to choose.

Thread-safe: any thread may count; one lock guards the counts (O(1) under it), the
log line is written outside it.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections import Counter
from collections.abc import Callable

__all__ = ["ErrorCounts", "errno_name", "type_name"]


def _same(message: str) -> str:
    return message


def errno_name(exc: BaseException) -> str:
    """The symbolic name of `exc`'s errno ("ENOSPC"), or its class name without one."""
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return errno.errorcode.get(code, str(code))
    return type(exc).__name__


def type_name(exc: BaseException) -> str:
    """`exc`'s class name ("ConnectionError")."""
    return type(exc).__name__


class ErrorCounts:
    """`count(kind, message)`: one more problem of `kind` ("op.what", e.g.
    "load.ConnectionError", "store.ENOSPC"); the first of each kind is logged as a
    warning, `prefix: message`, scrubbed. `record` and `note` build the kind and
    the message. `snapshot()`: the counts, a copy."""

    def __init__(self, logger: logging.Logger, prefix: str, *,
                 scrub: Callable[[str], str] = _same,
                 kind: Callable[[BaseException], str] = errno_name,
                 describe: Callable[[BaseException], str] = str):
        self._log = logger
        self._prefix = prefix
        self._scrub = scrub
        self._kind = kind
        self._describe = describe
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

    def record(self, op: str, exc: BaseException, detail: str = "") -> None:
        """Count a failed `op`: kind "op.<kind(exc)>", message "op failed:
        <describe(exc)> [detail]"."""
        suffix = f" [{detail}]" if detail else ""
        self.count(f"{op}.{self._kind(exc)}",
                          f"{op} failed: {self._describe(exc)}{suffix}")

    def note(self, op: str, what: str, message: str) -> None:
        """Count a problem of `op` that is not an exception (a corrupt file, a value
        of another format): kind "op.what"."""
        self.count(f"{op}.{what}", message)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)
