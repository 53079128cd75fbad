"""Small result types of the manager's scheduler-facing calls."""

from __future__ import annotations

from dataclasses import dataclass

from kvtiers.contract.keys import BlockKey


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


#: The tier name of the CPU pool in events and stats.
CPU = "cpu"


@dataclass(frozen=True, slots=True)
class OffloadEvent:
    """Blocks that became readable from a tier ("stored") or left it ("removed").

    `tier` says which: "cpu" (the CPU pool) or a secondary tier's display name as
    in `stats()["tiers"]` ("fs", "fs#2"); vLLM calls it the medium. A secondary
    tier's "stored" is a successful cascade into it, its "removed" what the tier
    reported through `TierContext.events`. `source`, on a "stored" event of the
    pool, names the secondary tier the blocks were promoted from; None when the
    engine stored them from the GPU (and on every other event)."""

    kind: str
    keys: list[BlockKey]
    tier: str = CPU
    source: str | None = None
