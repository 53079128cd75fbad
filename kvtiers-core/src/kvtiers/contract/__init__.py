"""The contract: every type that tiers, the manager and engines share.

Torch-free, and free of the machinery that runs it: a tier (`SecondaryTier`, built
from a `TierContext` and its config section by `create_tier`), what moves
(`TransferJob`, `JobResult`, `FailureReason`), how blocks are named (`BlockKey`,
`Namespace`, `BlockGeometry`), what a lookup answers (`LookupResult`), what a tier
reports (`TierStats`, `TierEvents`, `TierInventory`, `VerifyReport`), what it may
call back (`ParentManager`), the pool it reads and writes (`PoolView`), the clock
and the metrics sink it is given, and the interface of eviction policies
(`EvictionPolicy`). `CONTRACT_VERSION` is the version plugins are
written for (defined with the plugin machinery, `kvtiers.plugins.version`).

Tier authors import these names from `kvtiers.sdk`, which re-exports them.
"""

from kvtiers.contract.clock import Clock, ManualClock, monotonic
from kvtiers.contract.events import TierEvents
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.contract.inventory import BlockRecord, NamespaceInventory, TierInventory
from kvtiers.contract.jobs import FailureReason, JobResult, TransferJob
from kvtiers.contract.keys import GROUP_BYTES, BlockKey, key_group, key_hash, make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.metrics import (
    BindingSink,
    LabelledSink,
    MetricsSink,
    NullMetrics,
    RecordingMetrics,
)
from kvtiers.contract.namespace import DTYPE_BYTES, FORMAT_VERSION, BlockGeometry, Namespace
from kvtiers.contract.parent import ParentManager
from kvtiers.contract.pool_view import ALIGN, PoolView, round_up
from kvtiers.contract.section import TierSection
from kvtiers.contract.stats import StatsRecorder, TierStats
from kvtiers.contract.tier import SecondaryTier, TierContext, create_tier
from kvtiers.contract.verification import BadBlock, Progress, VerifyReport
from kvtiers.plugins.version import CONTRACT_VERSION

__all__ = [
    "ALIGN",
    "CONTRACT_VERSION",
    "DTYPE_BYTES",
    "FORMAT_VERSION",
    "GROUP_BYTES",
    "BadBlock",
    "BindingSink",
    "BlockGeometry",
    "BlockKey",
    "BlockRecord",
    "Clock",
    "EvictionPolicy",
    "FailureReason",
    "JobResult",
    "LabelledSink",
    "LookupResult",
    "ManualClock",
    "MetricsSink",
    "NamespaceInventory",
    "Namespace",
    "NullMetrics",
    "ParentManager",
    "PoolView",
    "Progress",
    "RecordingMetrics",
    "SecondaryTier",
    "StatsRecorder",
    "TierContext",
    "TierEvents",
    "TierInventory",
    "TierSection",
    "TierStats",
    "TransferJob",
    "VerifyReport",
    "create_tier",
    "key_group",
    "key_hash",
    "make_key",
    "monotonic",
    "round_up",
]
