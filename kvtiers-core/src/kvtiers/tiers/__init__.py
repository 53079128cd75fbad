"""The core's built-in tiers and the factory that builds any registered tier.

- `create_tier(section, ctx, registry=None)`: build a tier by its registered name.
- `MemoryTier` (`memory`): bounded, verifying, in-process RAM tier.
- `FaultyTier` (`faulty`): wraps any tier and injects faults, reproducibly.

The job engine and the bounded index these tiers are built on are public SDK in
`kvtiers.sdk`.

The tier classes are imported on first use: registering the built-ins (every
`kvtiers` command does) must not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtiers.tiers._factory import create_tier

if TYPE_CHECKING:
    from kvtiers.tiers.faulty import FaultyTier
    from kvtiers.tiers.memory import MemoryTier

__all__ = ["FaultyTier", "MemoryTier", "create_tier"]

_LAZY = {
    "FaultyTier": "kvtiers.tiers.faulty",
    "MemoryTier": "kvtiers.tiers.memory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvtiers.tiers' has no attribute {name!r}")
