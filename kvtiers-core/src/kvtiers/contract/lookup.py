"""The answer to "where is this block?", shared by the manager and the tiers."""

from __future__ import annotations

import enum


class LookupResult(enum.Enum):
    """`HIT`: readable now (from the CPU pool for the manager; from the tier for a tier).
    `MISS`: nowhere; an engine's prefix scan stops here.
    `HIT_PENDING` (manager only): found, a write into the pool is in flight; retry next step.
    `RETRY`: not known yet, an existence probe is in flight; keep scanning, retry next step.
    """

    HIT = "hit"
    MISS = "miss"
    HIT_PENDING = "hit_pending"
    RETRY = "retry"
