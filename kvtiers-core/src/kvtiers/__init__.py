"""kvtiers: move the KV cache of LLM inference engines across storage tiers.

The top level re-exports the contracts that tiers and engines import. It must stay
free of torch: the CLI, config and plugin listing start fast, and the scheduler side
and every tier run where torch is not installed (it is the extra `kvtiers-core[torch]`,
for the worker side and the bench).
"""

from kvtiers.errors import ConfigError, KvtiersError, MissingExtraError, PluginError
from kvtiers.jobs import FailureReason, JobResult, TransferJob
from kvtiers.keys import BlockKey, key_group, make_key
from kvtiers.lookup import LookupResult
from kvtiers.namespace import FORMAT_VERSION, BlockGeometry, Namespace
from kvtiers.parent import ParentManager
from kvtiers.pool_view import PoolView
from kvtiers.stats import TierStats
from kvtiers.tier import CONTRACT_VERSION, SecondaryTier, TierContext

__version__ = "0.1.0"

__all__ = [
    "CONTRACT_VERSION",
    "FORMAT_VERSION",
    "BlockGeometry",
    "BlockKey",
    "ConfigError",
    "FailureReason",
    "JobResult",
    "KvtiersError",
    "LookupResult",
    "MissingExtraError",
    "Namespace",
    "ParentManager",
    "PluginError",
    "PoolView",
    "SecondaryTier",
    "TierContext",
    "TierStats",
    "TransferJob",
    "__version__",
    "key_group",
    "make_key",
]
