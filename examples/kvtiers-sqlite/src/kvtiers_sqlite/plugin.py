"""The module the `kvtiers` entry point names.

Kept thin: `kvtiers plugins` and `kvtiers validate` import it, so it names the tier
class as a "module:Class" string instead of importing it. The schema is what
`kvtiers validate` checks a `{"type": "sqlite", ...}` section against.
"""

from __future__ import annotations

from kvtiers.plugins import TierRecord, hookimpl
from kvtiers.sdk import CONTRACT_VERSION

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "minLength": 1,
            "description": "the SQLite file; created, with its directory, if missing",
        },
        "capacity_bytes": {
            "type": "integer",
            "minimum": 1,
            "description": "block bytes the file may hold; least recently used go first",
        },
    },
    "required": ["path", "capacity_bytes"],
    "additionalProperties": False,
}


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    return [
        TierRecord(
            name="sqlite",
            cls="kvtiers_sqlite.tier:SqliteTier",
            schema=SCHEMA,
            description="blocks in one SQLite file: persistent, checksummed, LRU-bounded",
            contract_version=CONTRACT_VERSION,
        )
    ]
