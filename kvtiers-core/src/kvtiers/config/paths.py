"""JSON paths for messages, such as `$.secondary_tiers[1].inner.capacity_bytes`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

ROOT = "$"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

PathParts = tuple[str | int, ...]


def join(path: str, *parts: str | int) -> str:
    """`path` extended by object keys (`.key`, or `["odd key"]`) and array indexes."""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _IDENTIFIER.match(part):
            path += f".{part}"
        else:
            path += f"[{json.dumps(part)}]"
    return path


def rename(parts: Iterable[str | int], renames: Mapping[PathParts, PathParts]) -> PathParts:
    """Map a path inside a section back to the names the user wrote.

    `renames` maps where a value was moved to (such as `("threads", "load")`) to
    where it was written (`("n_read_threads",)`); the longest matching prefix wins.
    """
    parts = tuple(parts)
    for n in range(len(parts), 0, -1):
        moved = renames.get(parts[:n])
        if moved is not None:
            return moved + parts[n:]
    return parts


def path_sort_key(path: str) -> list[tuple[int, int | str]]:
    """Orders paths as a reader walks the document: `$.a[2]` before `$.a[10]`,
    a section's keys together."""
    key: list[tuple[int, int | str]] = []
    for token in re.split(r'[.\[\]"]+', path):
        if token.isdigit():
            key.append((0, int(token)))
        elif token:
            key.append((1, token))
    return key
