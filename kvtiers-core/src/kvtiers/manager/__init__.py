"""The scheduler side: `TieringOffloadingManager`, built from a config by
`build_manager` (its tiers by name, each in a `MeteredTier` when metrics are on),
and the small types its calls return; `CircuitBreaker`, the per-tier breaker, for
engine adapters that drive tiers themselves (kvtiers-sglang)."""

from kvtiers.manager.breaker import CircuitBreaker
from kvtiers.manager.build import build_manager, num_slots_for, tier_names
from kvtiers.manager.manager import TieringOffloadingManager
from kvtiers.manager.metered_tier import MeteredTier
from kvtiers.manager.outputs import OffloadEvent, PrefixLookup, PrepareStoreOutput

__all__ = [
    "CircuitBreaker",
    "MeteredTier",
    "OffloadEvent",
    "PrefixLookup",
    "PrepareStoreOutput",
    "TieringOffloadingManager",
    "build_manager",
    "num_slots_for",
    "tier_names",
]
