"""The fs tier's `ErrorCounts` (kvtiers.sdk): errors counted by kind and logged once
per kind: a full disk or a vanished root must not flood the log with one line per
block."""

from __future__ import annotations

import errno
import logging

from kvtiers.sdk import ErrorCounts


def errno_name(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return errno.errorcode.get(code, str(code))
    return type(exc).__name__


class ErrorLog(ErrorCounts):
    """Kinds "op.ERRNO" (e.g. "store.ENOSPC") and "op.what" ("load.checksum")."""

    def __init__(self, logger: logging.Logger, where: str):
        super().__init__(logger, f"kvtiers-fs {where}")

    def record(self, op: str, exc: BaseException, detail: str = "") -> None:
        self.count(f"{op}.{errno_name(exc)}",
                   f"{op} failed: {exc}{f' [{detail}]' if detail else ''}")

    def note(self, op: str, what: str, message: str) -> None:
        """Count and log once a problem that is not an exception (a corrupt file)."""
        self.count(f"{op}.{what}", message)
