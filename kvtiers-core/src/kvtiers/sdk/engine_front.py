"""`EngineFront`: what the two job engines (`JobEngine` on threads, `AsyncJobEngine`
on an event loop) share - the scheduler-side calls and the bookkeeping behind them.

A subclass supplies `_submit(job, kind, state)`: how an admitted job reaches its
workers. Everything here is the scheduler thread's and never blocks, except `drain`,
which waits on purpose (any thread but the engine's own).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from kvtiers.contract.jobs import JobResult, TransferJob
from kvtiers.contract.stats import StatsRecorder
from kvtiers.contract.tier import TierContext
from kvtiers.sdk.dualqueue import LOAD, STORE, Kind
from kvtiers.sdk.job import CrashHook, JobFlow, JobLedger

__all__ = ["EngineFront"]

H = TypeVar("H")  # the hooks' type: JobHooks or AsyncJobHooks


class EngineFront(ABC, Generic[H]):
    """Hooks per kind, the tier's clock, the ledger (admission, exactly-once results,
    drain) and the job flow (units, outcomes, stats). `name` (default
    "kvtiers-<tier>") names threads and log lines."""

    def __init__(self, ctx: TierContext, *, load: H, store: H,
                 stats: StatsRecorder | None, batch_bytes: int, block_bytes: int | None,
                 on_crash: CrashHook | None, name: str | None):
        self._name = name or f"kvtiers-{ctx.name or 'tier'}"
        self._hooks: dict[Kind, H] = {LOAD: load, STORE: store}
        self._clock = ctx.clock
        self._ledger = JobLedger(stats)
        self._flow = JobFlow(self._ledger, logger=ctx.logger,
                             block_bytes=ctx.block_bytes if block_bytes is None else block_bytes,
                             batch_bytes=batch_bytes, on_crash=on_crash, what=self._name)

    @property
    def closed(self) -> bool:
        return self._ledger.closed

    @property
    def pending(self) -> int:
        """Jobs submitted and not reported yet."""
        return self._ledger.active

    def submit_load(self, job: TransferJob, state: Any = None) -> None:
        """Queue a load. `state` is the tier's (what it pinned at submit, say): it
        reaches every hook as `job.state`; the end hook runs even if the job never
        does, so whatever was taken at submit is always released."""
        self._submit(job, LOAD, state)

    def submit_store(self, job: TransferJob, state: Any = None) -> None:
        """Queue a store (see `submit_load`)."""
        self._submit(job, STORE, state)

    def take_finished(self) -> list[JobResult]:
        """Results of the jobs reported since the last call."""
        return self._ledger.take()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait (real time) until every submitted job is reported; False on timeout."""
        return self._ledger.drain(timeout)

    @abstractmethod
    def _submit(self, transfer: TransferJob, kind: Kind, state: Any) -> None:
        """Admit `transfer` and hand it to the workers; never blocks."""
