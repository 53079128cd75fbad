"""The module the `kvtiers` entry point names: registers the `scratch` tier.

Kept thin: `kvtiers plugins` and `kvtiers validate` import it, so it names the tier
class as a "module:Class" string instead of importing it. `SCHEMA` is what
`kvtiers validate` checks a `{"type": "scratch", ...}` section against; the tier
resolves its section with it too.
"""

from __future__ import annotations

from typing import Any

from kvtiers.plugins import TierRecord, hookimpl
from kvtiers.sdk import CONTRACT_VERSION

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "root_dir": {
            "type": "string",
            "pattern": "^/",
            "title": "an absolute path",
            # No other tier section of a config may name this directory.
            "x-kvtiers": "own_directory",
            "description": "the directory the block files go in; created if missing",
        },
        "capacity_bytes": {
            "type": "integer",
            "minimum": 1,
            "description": "block bytes the directory may hold; the policy picks victims",
        },
        "eviction_policy": {
            "type": "string",
            # The name of a registered eviction policy, checked like the pool's.
            "x-kvtiers": "policy",
            "default": "lru",
            "description": "which block goes first when the directory is full",
        },
        "threads": {
            "type": "integer",
            "minimum": 1,
            "maximum": 64,
            "default": 2,
            "description": "I/O threads; each takes loads before stores",
        },
    },
    "required": ["root_dir", "capacity_bytes"],
    "additionalProperties": False,
}


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    return [
        TierRecord(
            name="scratch",
            cls="kvtiers_scratch.tier:ScratchTier",
            schema=SCHEMA,
            description="block files in a scratch directory: bounded, verified, not persistent",
            contract_version=CONTRACT_VERSION,
        )
    ]
