"""The plugin system: hook specifications, records, and the registry that loads
the core's built-ins and every `kvtiers` entry point."""

from kvtiers.plugins.hookspecs import hookimpl
from kvtiers.plugins.records import (
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

__all__ = [
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
