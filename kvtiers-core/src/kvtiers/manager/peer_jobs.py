"""`PeerJobs`: the pool blocks a peer-serving tier is shipping to remote peers.

`create(keys)` holds the slots of readable blocks until `complete(job_id)`; a job is
all or nothing, and a second or unknown completion is ignored. Called under the
manager's lock (peers are served from the tier's own threads). O(1) per block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtiers.contract.jobs import TransferJob
from kvtiers.contract.keys import BlockKey
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
        """A job over the slots of `keys`, held; None when any is not READY (the
        holds are taken in one batch: a peer's fetch pins thousands of blocks)."""
        keys = list(keys)
        try:
            slots = self._slots.hold_readable(keys)
        except KeyError:
            return None
        try:
            job = TransferJob(self._next_id(), keys, slots)
        except ValueError:  # a repeated key: the holds go again
            self._slots.release_held(keys, slots)
            raise
        self._jobs[job.job_id] = (keys, slots)
        return job

    def complete(self, job_id: int) -> None:
        """The job's bytes were shipped (or the attempt ended): its holds go."""
        entry = self._jobs.pop(job_id, None)
        if entry is None:
            return
        self._slots.release_held(*entry)
