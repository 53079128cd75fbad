"""The plugin system: hook specifications, records, and the registry that loads
the core's built-ins and every `kvtiers` entry point.

What a plugin's `plugin.py` needs is here: `hookimpl`, the records its hooks
return (`TierRecord`, `PolicyRecord`, `CommandRecord`, ...), the
`CONTRACT_VERSION` they name, and the schema fragments its config schema spreads
(`EVICTION_POLICY`, `CAPACITY_BYTES`, `THREADS`).
"""

from kvtiers.plugins.hookspecs import hookimpl
from kvtiers.plugins.records import (
    AdmissionRecord,
    CommandRecord,
    PolicyRecord,
    TierRecord,
    VllmSpecRecord,
    VllmTierRecord,
)
from kvtiers.plugins.registry import (
    PluginFailure,
    Registered,
    Registry,
    get_registry,
    load_registry,
)
from kvtiers.plugins.schema_fragments import (
    CAPACITY_BYTES,
    DRAFT,
    EVICTION_POLICY,
    THREADS,
)
from kvtiers.plugins.version import CONTRACT_VERSION

__all__ = [
    "CAPACITY_BYTES",
    "CONTRACT_VERSION",
    "DRAFT",
    "EVICTION_POLICY",
    "THREADS",
    "AdmissionRecord",
    "CommandRecord",
    "PluginFailure",
    "PolicyRecord",
    "Registered",
    "Registry",
    "TierRecord",
    "VllmSpecRecord",
    "VllmTierRecord",
    "get_registry",
    "hookimpl",
    "load_registry",
]
