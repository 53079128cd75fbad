"""kvtiers: move the KV cache of LLM inference engines across storage tiers.

This is the engine face: what an engine embedding kvtiers imports. The packages
are the layers, each importing only those before it (docs/architecture.md):
`plugins` (records, registry, the contract version) -> `contract` (the types tiers,
the manager and engines share) -> `pool`, `policies`, `admission` -> `config` ->
`sdk` (the tier author's face), `manager`, `swap` (the worker side) -> `tiers`
(memory, faulty), `metrics`, `ops` -> `testing`, `bench`, `cli`, `default_plugins`;
beside them a few leaf helpers (`errors`, `extras`, `native`, `humanize`, `hashing`).

The top level re-exports the contract's main names. It must stay
free of torch: the CLI, config and plugin listing start fast, and the scheduler side
and every tier run where torch is not installed (it is the extra `kvtiers-core[torch]`,
for the worker side and the bench).

What an engine embedding kvtiers needs (docs/engines.md) is reachable from here too,
imported on first use so that `import kvtiers` stays light: `load_config`,
`build_manager`, `TieringOffloadingManager`, `OffloadEvent`, `CpuPool` (the shared pool
and its `view`), `prefix_block_hashes`, and the worker side's `DeviceSwapper` and
`KVLayout` (those two need torch when built, not when imported).
"""

from typing import TYPE_CHECKING

from kvtiers.contract import (
    CONTRACT_VERSION,
    FORMAT_VERSION,
    BlockGeometry,
    BlockKey,
    FailureReason,
    JobResult,
    LookupResult,
    Namespace,
    ParentManager,
    PoolView,
    SecondaryTier,
    TierContext,
    TierStats,
    TransferJob,
    key_group,
    make_key,
)
from kvtiers.errors import ConfigError, KvtiersError, MissingExtraError, PluginError
from kvtiers.lazy import lazy_names

if TYPE_CHECKING:
    from kvtiers.config.loader import load_config
    from kvtiers.hashing import prefix_block_hashes
    from kvtiers.manager import OffloadEvent, TieringOffloadingManager
    from kvtiers.manager.build import build_manager
    from kvtiers.pool import CpuPool
    from kvtiers.swap import DeviceSwapper, KVLayout

__version__ = "0.1.0"

# name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "CpuPool": "kvtiers.pool",
    "DeviceSwapper": "kvtiers.swap",
    "KVLayout": "kvtiers.swap",
    "OffloadEvent": "kvtiers.manager",
    "TieringOffloadingManager": "kvtiers.manager",
    "build_manager": "kvtiers.manager.build",
    "load_config": "kvtiers.config.loader",
    "prefix_block_hashes": "kvtiers.hashing",
}


__getattr__ = lazy_names(__name__, _LAZY)

__all__ = [
    "CONTRACT_VERSION",
    "FORMAT_VERSION",
    "BlockGeometry",
    "BlockKey",
    "ConfigError",
    "CpuPool",
    "DeviceSwapper",
    "FailureReason",
    "JobResult",
    "KVLayout",
    "KvtiersError",
    "LookupResult",
    "MissingExtraError",
    "Namespace",
    "OffloadEvent",
    "ParentManager",
    "PluginError",
    "PoolView",
    "SecondaryTier",
    "TierContext",
    "TierStats",
    "TieringOffloadingManager",
    "TransferJob",
    "__version__",
    "build_manager",
    "key_group",
    "load_config",
    "make_key",
    "prefix_block_hashes",
]
