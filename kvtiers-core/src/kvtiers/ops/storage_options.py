"""fsspec storage options as a user types them on a command line (`KEY=VALUE`), for
every command that opens a snapshot or a store by URL (`kvtiers snapshot`,
`kvtiers bench`, `kvtiers serve`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kvtiers.errors import KvtiersError

__all__ = ["parse_storage_options"]


def parse_storage_options(items: Sequence[str]) -> dict[str, Any] | None:
    """`KEY=VALUE` strings as fsspec storage options (None for none). The message of
    a malformed one names its key, never its value."""
    if not items:
        return None
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise KvtiersError("--storage-option takes KEY=VALUE (one option each)")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
