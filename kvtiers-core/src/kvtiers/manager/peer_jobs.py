"""`PeerJobs`: the pool blocks a peer-serving tier is shipping to remote peers.

`create(keys)` holds the slots of readable blocks until `complete(job_id)`; a job is
all or nothing, and a second or unknown completion is ignored. Called under the
manager's lock (peers are served from the tier's own threads). O(1) per block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtiers.jobs import TransferJob
from kvtiers.keys import BlockKey
from kvtiers.manager.slot_table import SlotTable


class PeerJobs:
    def __init__(self, slots: SlotTable, next_id: Callable[[], int]):
        self._slots = slots
        self._next_id = next_id
        self._jobs: dict[int, tuple[list[BlockKey], list[int]]] = {}

    def __len__(self) -> int:
        """Jobs not completed yet."""
        return len(self._jobs)

    def create(self, keys: Sequence[BlockKey]) -> TransferJob | None:
        """A job over the slots of `keys`, held; None when any is not READY."""
        slots = self._slots.ready_slots(keys)
        if slots is None:
            return None
        # Built first: it refuses a repeated key before any hold is taken.
        job = TransferJob(self._next_id(), list(keys), slots)
        hold = self._slots.hold
        for key, slot in zip(keys, slots, strict=True):
            hold(key, slot)
        self._jobs[job.job_id] = (list(job.keys), slots)
        return job

    def complete(self, job_id: int) -> None:
        """The job's bytes were shipped (or the attempt ended): its holds go."""
        entry = self._jobs.pop(job_id, None)
        if entry is None:
            return
        release = self._slots.release
        for key, slot in zip(*entry, strict=True):
            release(key, slot)
