"""The built-in tiers: `memory` and `faulty`."""

from __future__ import annotations

from kvtiers.plugins.hookspecs import hookimpl
from kvtiers.plugins.records import TierRecord
from kvtiers.plugins.version import CONTRACT_VERSION


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    # The schemas only (plain data); the tier classes load when a config selects them.
    from kvtiers.tiers.schemas import FAULTY_SCHEMA, MEMORY_SCHEMA

    return [
        TierRecord(
            "memory",
            "kvtiers.tiers.memory:MemoryTier",
            MEMORY_SCHEMA,
            "blocks in this process's RAM: bounded, evicted by policy, checksummed",
            CONTRACT_VERSION,
        ),
        TierRecord(
            "faulty",
            "kvtiers.tiers.faulty:FaultyTier",
            FAULTY_SCHEMA,
            "wraps any tier and injects errors, misses, latency, hangs and corruption (tests)",
            CONTRACT_VERSION,
        ),
    ]
