"""What the manager keeps per secondary tier (the tier, its breaker, its bounded
cascade queue and the counters credited to it) and per job it gave a tier. Plain
records: `TierTraffic` owns and changes them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvtiers.contract.keys import BlockKey
from kvtiers.contract.tier import SecondaryTier
from kvtiers.manager.breaker import CircuitBreaker

if TYPE_CHECKING:
    from kvtiers.admission.base import AdmissionPolicy


@dataclass
class TierCounters:
    promoted_hits: int = 0  # blocks promoted from this tier into the pool (credited hits)
    promotion_failures: int = 0
    cascaded_blocks: int = 0  # blocks copied down successfully
    cascades_dropped: int = 0  # copies never made: tier down, or evicted while deferred
    cascades_deferred: int = 0  # cascades that waited (unpinned) for room in the queue
    cascades_not_admitted: int = 0  # cascades the tier's admission policy refused
    cascade_failures: int = 0
    timeouts: int = 0  # jobs past their deadline
    lookup_errors: int = 0
    # Failed keys of this tier's jobs by reason, as the manager saw them (a job past
    # its deadline counts as `timeout` here even if the tier reports it later).
    job_errors: dict[str, int] = field(default_factory=dict)

    def count_errors(self, reasons: dict[Any, int]) -> None:
        for reason, n in reasons.items():
            name = getattr(reason, "value", str(reason))
            self.job_errors[name] = self.job_errors.get(name, 0) + n


@dataclass
class TierRuntime:
    index: int
    name: str
    tier: SecondaryTier
    breaker: CircuitBreaker
    queue_limit: int
    admission: AdmissionPolicy | None = None  # None: every block is admitted (`all`)
    # Cascades waiting for submission: (key, slot). Each queued entry holds a pin.
    queue: deque[tuple[BlockKey, int]] = field(default_factory=deque)
    # Cascades that found the queue full (write_through): (key, slot), holding no
    # pin; queued in order as room frees if the block is still in its slot.
    deferred: deque[tuple[BlockKey, int]] = field(default_factory=deque)
    # Promotions reserved during this step, submitted as one job in step().
    promotions: list[tuple[BlockKey, int]] = field(default_factory=list)
    inflight_cascade_blocks: int = 0
    # Blocks of jobs past their deadline that the tier has not reported yet: still
    # pinned (cascades) or quarantined (promotions). Counted against `queue_limit`.
    stuck_blocks: int = 0
    counters: TierCounters = field(default_factory=TierCounters)
    # write_through, with an admission policy: blocks its policy refused when they
    # were stored, still perhaps in the pool (the oldest forgotten past `num_slots`
    # entries: at most one per slot can still be resident). A pool hit of one offers
    # it again (`TierTraffic.used`).
    refused: dict[BlockKey, None] = field(default_factory=dict)


@dataclass
class TierJob:
    """A job the manager gave a tier: a promotion ("promote") or a cascade."""

    kind: str  # "promote" | "cascade"
    tier: TierRuntime
    keys: list[BlockKey]
    slots: list[int]
    deadline: float
    timed_out: bool = False
