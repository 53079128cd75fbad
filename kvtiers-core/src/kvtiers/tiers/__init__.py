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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtiers.tiers.faulty import FaultyTier
    from kvtiers.tiers.memory import MemoryTier

__all__ = ["FaultyTier", "MemoryTier"]

_LAZY = {
    "FaultyTier": "kvtiers.tiers.faulty",
    "MemoryTier": "kvtiers.tiers.memory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvtiers.tiers' has no attribute {name!r}")
