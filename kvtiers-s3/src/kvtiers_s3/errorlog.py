"""The s3 tier's `ErrorCounts` (kvtiers.sdk): errors counted by kind and logged once
per kind, scrubbed of credentials (no line may carry a secret)."""

from __future__ import annotations

import logging

from kvtiers.sdk import ErrorCounts

from kvtiers_s3.objects import describe
from kvtiers_s3.settings import S3Settings


class ErrorLog(ErrorCounts):
    """Kinds "op.ExceptionName" ("load.EndpointConnectionError") and "op.what"
    ("load.corrupt")."""

    def __init__(self, logger: logging.Logger, where: str, settings: S3Settings):
        super().__init__(logger, f"kvtiers-s3 {where}", scrub=settings.scrub)
        self._settings = settings

    def record(self, op: str, exc: BaseException) -> None:
        self.count(f"{op}.{type(exc).__name__}", f"{op} failed: {describe(exc, self._settings)}")

    def note(self, op: str, what: str, message: str) -> None:
        """A problem that is not an exception (a corrupt object)."""
        self.count(f"{op}.{what}", message)
