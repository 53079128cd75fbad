"""Small result types of the manager's scheduler-facing calls."""

from __future__ import annotations

from dataclasses import dataclass

from kvtiers.keys import BlockKey


@dataclass(frozen=True, slots=True)
class PrepareStoreOutput:
    """`keys` (the ones not already present, in call order) go to `slots`;
    `evicted` were removed from the pool to make room."""

    keys: list[BlockKey]
    slots: list[int]
    evicted: list[BlockKey]


@dataclass(frozen=True, slots=True)
class PrefixLookup:
    """`hits`: leading blocks readable from the pool now. `retry`: some block of the
    prefix is on its way (promotion or probe in flight): ask again next step."""

    hits: int
    retry: bool


@dataclass(frozen=True, slots=True)
class OffloadEvent:
    """Blocks that became readable from the CPU pool ("stored") or left it ("removed")."""

    kind: str
    keys: list[BlockKey]
    medium: str = "cpu"
