"""Transfer jobs and their results: the unit of asynchronous work on every tier.

A `TransferJob` names blocks by key and the CPU-pool slots they are read from
(store) or written to (load). A `JobResult` says, per key, what happened. The
worker-side `DeviceSwapper` reports the same `JobResult` type.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvtiers.contract.keys import BlockKey


# Not enum.StrEnum (3.11+): kvtiers-core supports Python 3.10.
class FailureReason(str, enum.Enum):  # noqa: UP042
    """Why one key of a job failed. Every reason is a miss to the engine, never an error."""

    MISSING = "missing"  # the tier does not hold the block (any more)
    CORRUPT = "corrupt"  # the bytes failed verification; the tier dropped its copy
    IO = "io"  # an I/O or transport error
    TIMEOUT = "timeout"  # the job passed its deadline
    FULL = "full"  # no capacity could be freed for a store
    CLOSED = "closed"  # the tier was closed before the job ran
    REJECTED = "rejected"  # refused by policy (breaker open, namespace mismatch, ...)


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One asynchronous transfer of a list of blocks between the CPU pool and a tier.

    `keys[i]` lives in pool slot `slots[i]`. `deadline` is a time on the tier's clock
    (`TierContext.clock`) after which the job counts as failed with `timeout`; None
    means no deadline. Job ids are assigned by the manager and unique per manager.
    """

    job_id: int
    keys: Sequence[BlockKey]
    slots: Sequence[int]
    deadline: float | None = None

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.slots):
            raise ValueError(
                f"job {self.job_id}: {len(self.keys)} keys but {len(self.slots)} slots"
            )
        # A result holds one outcome per key, so a key may appear only once.
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"job {self.job_id}: a key appears more than once")


@dataclass(slots=True)
class JobResult:
    """What happened to a job: which keys succeeded, which failed and why.

    A tier reports each submitted job exactly once, and only when none of its own
    I/O can still touch the job's slots. `bytes_moved` counts block bytes copied to
    or from the pool (a store of keys already present moves 0); `seconds` is the
    wall time the tier spent on the job (perf_counter), not the injectable clock.
    """

    job_id: int
    ok: list[BlockKey] = field(default_factory=list)
    failed: dict[BlockKey, FailureReason] = field(default_factory=dict)
    bytes_moved: int = 0
    seconds: float = 0.0

    @property
    def success(self) -> bool:
        """True when every key of the job succeeded."""
        return not self.failed

    @classmethod
    def all_failed(
        cls, job: TransferJob, reason: FailureReason, seconds: float = 0.0
    ) -> JobResult:
        return cls(job.job_id, [], {k: reason for k in job.keys}, 0, seconds)

    def reasons(self) -> Mapping[FailureReason, int]:
        """Count of failed keys per reason."""
        counts: dict[FailureReason, int] = {}
        for reason in self.failed.values():
            counts[reason] = counts.get(reason, 0) + 1
        return counts
