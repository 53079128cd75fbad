"""What a snapshot operation raises and how it words a library's error: shared by
the zarr store (`snapshot_store`) and the target rules (`snapshot_target`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers.config.redact import credential_values, scrub
from kvtiers.errors import KvtiersError

__all__ = ["SnapshotError", "describe_error"]


class SnapshotError(KvtiersError):
    """A snapshot that cannot be read or written, or does not fit where it is loaded."""


def describe_error(exc: BaseException, options: Mapping[str, Any] | None) -> str:
    """What went wrong: the exception's type and message, with every credential in
    `options` (a secret, a token, a password: by name, at any depth) blanked should
    the message repeat one; an endpoint URL or a region stays readable."""
    text = scrub(str(exc).strip() or "no details", credential_values(options or {}))
    return f"{type(exc).__name__}: {text[:300]}"
