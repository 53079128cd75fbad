"""`kvtiers.sdk`: the hard parts of a tier, written once.

- `JobEngine` (`kvtiers.sdk.engine`): a tier's I/O threads and the contract's job
  bookkeeping - per-block work items and batching, exactly-once results, deadlines,
  `closed`, crash containment, start/end hooks, stats - on a
  `DualQueueThreadPool` (`kvtiers.sdk.dualqueue`: loads ahead of stores, idle
  threads steal).
- `AsyncJobEngine` (`kvtiers.sdk.aio`): the same for asyncio clients, on an event
  loop the engine owns, with bounded concurrency.
- `BoundedIndex` (`kvtiers.sdk.index`): key -> location under a byte capacity, with
  a registered eviction policy, reference-counted pins, reservations for stores in
  flight, removals reported, and recency export/restore as JSON.

A tier's work is described by `JobHooks` (`AsyncJobHooks`): functions that receive
a `Job` (`kvtiers.sdk.job`) and settle its keys. `AsyncJobEngine` is imported on
first use, so a tier on threads does not pay for asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtiers.sdk.dualqueue import LOAD, STORE, DualQueueThreadPool, Kind, Task
from kvtiers.sdk.engine import BATCH_BYTES, BatchFn, BlockFn, JobEngine, JobHooks
from kvtiers.sdk.index import BoundedIndex, EntryView, IndexView, Pins, Reservation, Verdict
from kvtiers.sdk.job import CrashHook, EndHook, Job, JobLedger, Outcome, StartHook

if TYPE_CHECKING:
    from kvtiers.sdk.aio import AsyncBatchFn, AsyncBlockFn, AsyncJobEngine, AsyncJobHooks

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
    "DualQueueThreadPool",
    "EndHook",
    "EntryView",
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
]

_AIO = {"AsyncBatchFn", "AsyncBlockFn", "AsyncJobEngine", "AsyncJobHooks"}


def __getattr__(name: str) -> Any:
    if name in _AIO:
        from kvtiers.sdk import aio

        return getattr(aio, name)
    raise AttributeError(f"module 'kvtiers.sdk' has no attribute {name!r}")
