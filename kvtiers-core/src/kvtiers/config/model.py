"""Typed configuration objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TierSection:
    """One validated tier section: its `type` (a registered tier name), its options
    (validated against the tier's schema, defaults filled in, nested tier sections
    such as the `faulty` tier's `inner` turned into `TierSection`s), and the JSON path
    it came from (for messages)."""

    type: str
    options: Mapping[str, Any]
    path: str = "$"
