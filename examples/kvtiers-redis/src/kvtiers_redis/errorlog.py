"""The redis tier's `ErrorCounts` (kvtiers.sdk): errors counted by kind and logged
once per kind, scrubbed of credentials: a server that went away must not flood the
log with one line per block, and no line may carry a password."""

from __future__ import annotations

import logging

from kvtiers.sdk import ErrorCounts

from kvtiers_redis.settings import RedisSettings

__all__ = ["ErrorLog"]


class ErrorLog(ErrorCounts):
    """Kinds "op.ExceptionName" ("load.ConnectionError") and "op.what"
    ("load.foreign")."""

    def __init__(self, logger: logging.Logger, where: str, settings: RedisSettings):
        super().__init__(logger, f"kvtiers-redis {where} ({settings.address})",
                         scrub=settings.scrub)

    def record(self, op: str, exc: BaseException) -> None:
        self.note(op, type(exc).__name__, f"{op} failed: {type(exc).__name__}: {exc}")

    def note(self, op: str, what: str, message: str) -> None:
        """A problem that is not an exception (a value of another format)."""
        self.count(f"{op}.{what}", message)
