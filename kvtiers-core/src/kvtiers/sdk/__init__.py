"""`kvtiers.sdk`: the hard parts of a tier, written once.

- `JobEngine` (`kvtiers.sdk.engine`): a tier's I/O threads and the contract's job
  bookkeeping - per-block work items and batching, exactly-once results, deadlines,
  `closed`, crash containment, start/end hooks, stats - on a
  `DualQueueThreadPool` (`kvtiers.sdk.dualqueue`: loads ahead of stores, idle
  threads steal). An item that must wait for something else returns
  `job.defer(i)` (`Deferred`), settled later from any thread, instead of sleeping.
- `AsyncJobEngine` (`kvtiers.sdk.aio`): the same for asyncio clients, on an event
  loop the engine owns, with bounded concurrency.
- `BoundedIndex` (`kvtiers.sdk.index`): key -> location under a byte capacity, with
  a registered eviction policy, reference-counted pins, reservations for stores in
  flight, removals reported, and recency export/restore as JSON; a queued mode
  (the scheduler's pin/touch never take its lock) and a feed from shared storage
  (`adopt`, `hold`/`release`) for tiers whose decisions are in a shared journal.
- `ErrorCounts` (`kvtiers.sdk.errors`): problems counted by kind and logged once per
  kind, scrubbed of secrets (a tier's `stats().errors`).

A tier's work is described by `JobHooks` (`AsyncJobHooks`): functions that receive
a `Job` (`kvtiers.sdk.job`) and settle its keys. `AsyncJobEngine` is imported on
first use, so a tier on threads does not pay for asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtiers.sdk.dualqueue import LOAD, STORE, DualQueueThreadPool, Kind, Task
from kvtiers.sdk.engine import BATCH_BYTES, BatchFn, BlockFn, JobEngine, JobHooks
from kvtiers.sdk.errors import ErrorCounts
from kvtiers.sdk.index import BoundedIndex, EntryView, IndexView, Pins, Reservation, Verdict
from kvtiers.sdk.job import CrashHook, Deferred, EndHook, Job, JobLedger, Outcome, StartHook

if TYPE_CHECKING:
    from kvtiers.sdk.aio import (
        AsyncBatchFn,
        AsyncBlockFn,
        AsyncJobEngine,
        AsyncJobHooks,
        run_off_loop,
    )

__all__ = [
    "BATCH_BYTES",
    "LOAD",
    "STORE",
    "AsyncBatchFn",
    "AsyncBlockFn",
    "AsyncJobEngine",
    "AsyncJobHooks",
    "BatchFn",
    "BlockFn",
    "BoundedIndex",
    "CrashHook",
    "Deferred",
    "DualQueueThreadPool",
    "EndHook",
    "EntryView",
    "ErrorCounts",
    "IndexView",
    "Job",
    "JobEngine",
    "JobHooks",
    "JobLedger",
    "Kind",
    "Outcome",
    "Pins",
    "Reservation",
    "StartHook",
    "Task",
    "Verdict",
    "run_off_loop",
]

_AIO = {"AsyncBatchFn", "AsyncBlockFn", "AsyncJobEngine", "AsyncJobHooks", "run_off_loop"}


def __getattr__(name: str) -> Any:
    if name in _AIO:
        from kvtiers.sdk import aio

        return getattr(aio, name)
    raise AttributeError(f"module 'kvtiers.sdk' has no attribute {name!r}")
