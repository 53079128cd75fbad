"""The secondary-tier contract: what a storage tier plugin implements.

A tier never touches the GPU. The manager calls it from one thread (the scheduler's);
`submit_*` must not block: the tier does its I/O on its own threads and reports each
job exactly once through `get_finished_jobs()`, when none of its I/O can still touch
the job's slots. Failures are per-key `FailureReason`s, never exceptions.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtiers.clock import Clock, monotonic
from kvtiers.jobs import JobResult, TransferJob
from kvtiers.keys import BlockKey
from kvtiers.lookup import LookupResult
from kvtiers.metrics import MetricsSink, NullMetrics
from kvtiers.namespace import Namespace
from kvtiers.pool_view import PoolView
from kvtiers.stats import TierStats

# Version of this contract. A plugin record names the version it was written for;
# a mismatch is reported by `kvtiers plugins` and breaks only configs selecting it.
CONTRACT_VERSION = 1


@dataclass(frozen=True)
class TierContext:
    """Everything the core hands a tier besides its own config section."""

    pool: PoolView
    namespace: Namespace
    clock: Clock = monotonic
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("kvtiers.tier"))
    metrics: MetricsSink = field(default_factory=NullMetrics)
    name: str = ""  # the tier's name in the stack, e.g. "fs" or "secondary_tiers[1]"

    @property
    def slot_bytes(self) -> int:
        return self.pool.slot_bytes

    @property
    def block_bytes(self) -> int:
        return self.pool.block_bytes


class SecondaryTier(ABC):
    """A storage tier below the CPU pool. Construct with `(ctx, config)`, where
    `config` is the tier's validated config section (defaults filled in)."""

    # Capability flags. Read them from the instance, not the class: a wrapper (the
    # `faulty` tier) takes its inner tier's flags per instance.
    #: blocks survive a restart of the process (usage and recency too)
    persistent: bool = False
    #: several processes may use one store at once (lookup may answer RETRY)
    shared: bool = False
    #: implements `serve_external_requests`
    serves_peers: bool = False
    #: checksums every block on store and verifies it on load (`corrupt` on mismatch)
    verifies: bool = False

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        self.ctx = ctx
        self.config = config

    @abstractmethod
    def lookup(self, key: BlockKey) -> LookupResult:
        """HIT, MISS, or RETRY (a probe was started; ask again next step). Never blocks."""

    @abstractmethod
    def submit_store(self, job: TransferJob) -> None:
        """Copy the job's slots into the tier; keys already present succeed at once."""

    @abstractmethod
    def submit_load(self, job: TransferJob) -> None:
        """Copy the job's blocks into its slots; verified before success if `verifies`."""

    @abstractmethod
    def get_finished_jobs(self) -> list[JobResult]:
        """Results of jobs that ended since the last call. Never blocks."""

    @abstractmethod
    def drain(self, timeout: float | None = None) -> bool:
        """Block until every submitted job has ended (True) or `timeout` passed (False).
        Results stay queued for `get_finished_jobs`."""

    @abstractmethod
    def close(self) -> None:
        """Stop the tier's threads and release its resources. Idempotent. Jobs that
        never ran are reported as failed with `closed`; later submissions too."""

    @abstractmethod
    def stats(self) -> TierStats:
        """A snapshot of the tier's counters and usage."""

    # Optional parts of the contract.

    def touch(self, keys: Iterable[BlockKey]) -> None:
        """The keys were used: refresh their recency. Default: nothing."""

    def on_request_start(self, request_id: str) -> None:
        """An engine request started. Default: nothing."""

    def on_request_finished(self, request_id: str) -> None:
        """An engine request finished. Default: nothing."""

    def serve_external_requests(self, parent: Any) -> None:
        """Serve peers from `parent` (a `ParentManager`). Only for `serves_peers` tiers."""
        raise NotImplementedError(f"{type(self).__name__} does not serve peers")
