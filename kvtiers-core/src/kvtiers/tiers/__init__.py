"""The core's built-in tiers (any registered tier is built by
`kvtiers.contract.create_tier`).

- `MemoryTier` (`memory`): bounded, verifying, in-process RAM tier.
- `FaultyTier` (`faulty`): wraps any tier and injects faults, reproducibly.

The job engine and the bounded index these tiers are built on are public SDK in
`kvtiers.sdk`.

The tier classes are imported on first use: registering the built-ins (every
`kvtiers` command does) must not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtiers.lazy import lazy_names

if TYPE_CHECKING:
    from kvtiers.tiers.faulty import FaultyTier
    from kvtiers.tiers.memory import MemoryTier

__all__ = ["FaultyTier", "MemoryTier"]

_LAZY = {
    "FaultyTier": "kvtiers.tiers.faulty",
    "MemoryTier": "kvtiers.tiers.memory",
}


__getattr__ = lazy_names(__name__, _LAZY)
