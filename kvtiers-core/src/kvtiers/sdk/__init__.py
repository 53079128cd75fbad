"""`kvtiers.sdk`: the tier author's one face - the contract's names and the hard
parts of a tier, written once.

A tier plugin imports from here, `kvtiers.plugins` (records, `hookimpl`, schema
fragments) and `kvtiers.errors`, and nothing else of the core (its tests add
`kvtiers.testing`). Besides the contract (`SecondaryTier`, `TierContext`,
`TransferJob`, `JobResult`, `BlockKey`, `Namespace`, `PoolView`, `TierStats`, ...,
`create_tier`; see `kvtiers.contract`):

- `JobEngine` (`kvtiers.sdk.engine`): a tier's I/O threads and the contract's job
  bookkeeping - per-block work items and batching, exactly-once results, deadlines,
  `closed`, crash containment, start/end hooks, stats - on a
  `DualQueueThreadPool` (`kvtiers.sdk.dualqueue`: loads ahead of stores, idle
  threads steal). An item that must wait for something else returns
  `job.defer(i)` (`Deferred`), settled later from any thread, instead of sleeping.
- `AsyncJobEngine` (`kvtiers.sdk.aio`): the same for asyncio clients, on an event
  loop the engine owns, with bounded concurrency.
- `EngineTier` (`kvtiers.sdk.engine_tier`): a `SecondaryTier` on one of those
  engines (`engine`): `get_finished_jobs` and `drain` are the engine's.
  `IndexedTier` (`kvtiers.sdk.indexed_tier`): one whose holdings are a
  `BoundedIndex` (`index`) besides: `submit_*` (loads pinned at submit) and
  `touch`; its hooks' steps `end_pinned_load` (release the pins, touch what was
  read) and `reserve_store` (room reserved, present and full keys settled,
  evictions counted and deleted).
- `BoundedIndex` (`kvtiers.sdk.index`): key -> location under a byte capacity, with
  a registered eviction policy, reference-counted pins, reservations for stores in
  flight, removals reported, and recency export/restore as JSON; a queued mode
  (the scheduler's pin/touch never take its lock) and a feed from shared storage
  (`adopt`, `hold`/`release`) for tiers whose decisions are in a shared journal.
- `take_back(delete, errors)` (`kvtiers.sdk.late_writes`): undo a remote write whose
  outcome is unknown (a timeout while the server was frozen): delete until answered,
  then once more a second later.
- `ErrorCounts` (`kvtiers.sdk.error_counts`): problems counted by kind and logged
  once per kind, scrubbed of secrets (a tier's `stats().errors`): `record(op, exc)`,
  `note(op, what, message)`.
- `AsyncProbe` (`kvtiers.sdk.probe`): a step's existence probes batched onto one
  background thread, verdicts cached, for tiers that cannot answer a lookup at once;
  `probed_lookup`: the whole lookup of such a tier (held, else probed, else MISS).
- checksums (`kvtiers.sdk.integrity`): `checksum`, `verify`, and `checksum_slots` /
  `land_slots` for many pool slots in one call.
- `BlockHeaderFormat(magic)` (`kvtiers.sdk.block_header`): a self-describing,
  checksummed header in front of each block a tier stores on shared storage (key,
  namespace, block length and checksum): `pack`/`encode`, `parse` (`BlockHeader`),
  `judge` (any bytes: ours, `BadHeader.FOREIGN`/`NAMESPACE`/`BROKEN`), and a fast
  per-(namespace, block size) `HeaderPacker`; `block_header_bytes(key length)`.
- `credential_values(options)` / `scrub(text, values)` (`kvtiers.config.redact`):
  the credentials in free-form options (by name), blanked in a message.
- `resolve_options` (`kvtiers.config.options`): a hand-written section checked
  against the tier's schema, defaults filled in; `EvictionPolicy`, the interface of
  what `TierContext.make_policy` builds; `AdmissionPolicy`, the interface of an
  admission policy plugin.

A tier's work is described by `JobHooks` (`AsyncJobHooks`): functions that receive
a `Job` (`kvtiers.sdk.job`) and settle its keys. `AsyncJobEngine` is imported on
first use, so a tier on threads does not pay for asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtiers.admission.base import AdmissionPolicy
from kvtiers.config.options import resolve_options
from kvtiers.config.redact import credential_values, scrub
from kvtiers.contract import (
    ALIGN,
    CONTRACT_VERSION,
    DTYPE_BYTES,
    FORMAT_VERSION,
    GROUP_BYTES,
    BadBlock,
    BlockGeometry,
    BlockKey,
    BlockRecord,
    Clock,
    FailureReason,
    JobResult,
    LabelledSink,
    LookupResult,
    ManualClock,
    MetricsSink,
    Namespace,
    NamespaceInventory,
    NullMetrics,
    ParentManager,
    PoolView,
    Progress,
    RecordingMetrics,
    SecondaryTier,
    StatsRecorder,
    TierContext,
    TierEvents,
    TierInventory,
    TierSection,
    TierStats,
    TransferJob,
    VerifyReport,
    create_tier,
    key_group,
    key_hash,
    make_key,
    monotonic,
    round_up,
)
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.humanize import format_bytes
from kvtiers.lazy import lazy_names
from kvtiers.sdk.block_header import Bad as BadHeader
from kvtiers.sdk.block_header import BlockHeaderFormat, HeaderPacker
from kvtiers.sdk.block_header import Header as BlockHeader
from kvtiers.sdk.block_header import header_bytes as block_header_bytes
from kvtiers.sdk.dualqueue import LOAD, STORE, DualQueueThreadPool, Kind, Task
from kvtiers.sdk.engine import BATCH_BYTES, BatchFn, BlockFn, JobEngine, JobHooks
from kvtiers.sdk.engine_tier import EngineTier
from kvtiers.sdk.error_counts import ErrorCounts, errno_name, type_name
from kvtiers.sdk.index import BoundedIndex, EntryView, IndexView, Pins, Reservation, Verdict
from kvtiers.sdk.indexed_tier import IndexedTier, end_pinned_load, reserve_store
from kvtiers.sdk.integrity import (
    CHECKSUM_BYTES,
    CHECKSUM_NAME,
    checksum,
    checksum_bytes,
    checksum_slots,
    land_slots,
    verify,
)
from kvtiers.sdk.job import CrashHook, Deferred, EndHook, Job, JobLedger, Outcome, StartHook
from kvtiers.sdk.probe import AsyncProbe, probed_lookup

if TYPE_CHECKING:
    from kvtiers.sdk.aio import (
        AsyncBatchFn,
        AsyncBlockFn,
        AsyncJobEngine,
        AsyncJobHooks,
        run_off_loop,
    )
    from kvtiers.sdk.late_writes import take_back

__all__ = [
    "ALIGN",
    "BATCH_BYTES",
    "CHECKSUM_BYTES",
    "CHECKSUM_NAME",
    "CONTRACT_VERSION",
    "DTYPE_BYTES",
    "FORMAT_VERSION",
    "GROUP_BYTES",
    "LOAD",
    "STORE",
    "AdmissionPolicy",
    "AsyncBatchFn",
    "AsyncBlockFn",
    "AsyncJobEngine",
    "AsyncJobHooks",
    "AsyncProbe",
    "BadBlock",
    "BadHeader",
    "BatchFn",
    "BlockFn",
    "BlockGeometry",
    "BlockHeader",
    "BlockHeaderFormat",
    "BlockKey",
    "BlockRecord",
    "BoundedIndex",
    "Clock",
    "CrashHook",
    "Deferred",
    "DualQueueThreadPool",
    "EndHook",
    "EngineTier",
    "EntryView",
    "ErrorCounts",
    "EvictionPolicy",
    "FailureReason",
    "HeaderPacker",
    "IndexView",
    "IndexedTier",
    "Job",
    "JobEngine",
    "JobHooks",
    "JobLedger",
    "JobResult",
    "Kind",
    "LabelledSink",
    "LookupResult",
    "ManualClock",
    "MetricsSink",
    "Namespace",
    "NamespaceInventory",
    "NullMetrics",
    "Outcome",
    "ParentManager",
    "Pins",
    "PoolView",
    "Progress",
    "RecordingMetrics",
    "Reservation",
    "SecondaryTier",
    "StartHook",
    "StatsRecorder",
    "Task",
    "TierContext",
    "TierEvents",
    "TierInventory",
    "TierSection",
    "TierStats",
    "TransferJob",
    "Verdict",
    "VerifyReport",
    "block_header_bytes",
    "checksum",
    "checksum_bytes",
    "checksum_slots",
    "create_tier",
    "credential_values",
    "end_pinned_load",
    "format_bytes",
    "key_group",
    "key_hash",
    "land_slots",
    "make_key",
    "errno_name",
    "monotonic",
    "probed_lookup",
    "reserve_store",
    "resolve_options",
    "round_up",
    "run_off_loop",
    "scrub",
    "take_back",
    "type_name",
    "verify",
]

_AIO = {"AsyncBatchFn", "AsyncBlockFn", "AsyncJobEngine", "AsyncJobHooks", "run_off_loop"}


__getattr__ = lazy_names(__name__, {**dict.fromkeys(_AIO, "kvtiers.sdk.aio"),
                                    "take_back": "kvtiers.sdk.late_writes"})
