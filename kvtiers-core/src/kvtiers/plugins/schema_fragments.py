"""Pieces of JSON Schema that every tier's config schema uses, written once.

A tier's schema spreads them (a copy of its own: they are shared) and adds its own
description, and bounds where its own differ:
`"capacity_bytes": {**CAPACITY_BYTES, "description": "..."}`. The
`x-kvtiers` marks tell `kvtiers validate` what a value names (`policy`: a
registered eviction policy, checked against the installed ones with a
did-you-mean).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CAPACITY_BYTES", "DRAFT", "EVICTION_POLICY", "THREADS"]

#: the JSON Schema draft every kvtiers schema is written in (its "$schema")
DRAFT = "https://json-schema.org/draft/2020-12/schema"

#: a tier's byte bound (every tier has one: DESIGN invariant 4)
CAPACITY_BYTES: Mapping[str, Any] = {
    "type": "integer",
    "minimum": 1,
    "description": "bytes the tier may hold; the least recently used blocks go first",
}

#: the name of a registered eviction policy, `lru` unless the section says
EVICTION_POLICY: Mapping[str, Any] = {
    "type": "string",
    "minLength": 1,
    "x-kvtiers": "policy",
    "default": "lru",
    "description": "name of a registered eviction policy (see `kvtiers plugins`)",
}

#: a count of I/O threads
THREADS: Mapping[str, Any] = {
    "type": "integer",
    "minimum": 1,
    "maximum": 64,
    "default": 1,
    "description": "threads that move blocks between the pool and the tier",
}
