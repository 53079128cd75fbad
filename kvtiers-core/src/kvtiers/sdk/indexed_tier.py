"""`IndexedTier`: an `EngineTier` whose holdings are one `BoundedIndex` (key ->
location, under the tier's capacity), with the scheduler side's hand-offs written
once, and the two hook steps that go with them: `end_pinned_load` and
`reserve_store`.

Loads are pinned at submit: `submit_load` pins the job's keys that `index` holds
(what `lookup` called a HIT is not evicted before it is read) and hands the `Pins`
to the engine as `job.state`, or None once the engine is closed (the job then
fails `closed` without running). The load's end hook calls
`end_pinned_load(index, job)`: the pins go back and the keys that were read are
touched. The engine runs the end hook for every job, also one that never ran, so
no pin outlives its job.

A store's start hook begins with `reserve_store(index, job, size, ...)`: room is
reserved for every key (evicting by the index's policy), a key held already
succeeds without a copy, one that cannot fit fails `full`, and the evicted entries
are counted and handed to the tier to delete their storage; what is left to copy
comes back. The reservation is in `job.state` before anything else can fail, so
the store's end hook always finds it to commit and close.

The subclass sets `index` and `engine` in its constructor and implements `lookup`,
`stats`, `close` and the hooks' I/O. Threads: the methods here and `lookup` are the
scheduler thread's - dictionary work on the index and a hand-off to the engine,
never I/O. `end_pinned_load` and `reserve_store` run where the engine runs hooks
(its threads, or its loop), O(1) work per key; `reserve_store` calls `delete`
there too: on a `JobEngine` thread it may do the deletes itself (the room exists
before the copy starts), on an `AsyncJobEngine` loop it must not block (spawn them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from kvtiers.contract.jobs import FailureReason, TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.stats import StatsRecorder
from kvtiers.sdk.engine_tier import EngineTier
from kvtiers.sdk.index import BoundedIndex, Pins, Reservation, Verdict
from kvtiers.sdk.job import Job

__all__ = ["IndexedTier", "end_pinned_load", "reserve_store"]

L = TypeVar("L")


class IndexedTier(EngineTier, Generic[L]):
    """See the module doc. `L` is the index's location type."""

    #: what the tier holds, set by the subclass's constructor
    index: BoundedIndex[L]

    def submit_store(self, job: TransferJob) -> None:
        self.engine.submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        # Pinned now: what lookup called a HIT is not evicted before it is read.
        pins = None if self.engine.closed else self.index.pin(job.keys)
        self.engine.submit_load(job, pins)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        self.index.touch(keys)


def end_pinned_load(index: BoundedIndex[Any], job: Job) -> None:
    """The end hook's work for a load that `IndexedTier.submit_load` pinned: give
    back `job.state` (its `Pins`, or None: nothing was pinned), then touch the keys
    that were read."""
    pins: Pins[Any] | None = job.state
    if pins is not None:
        pins.release()
    index.touch(job.succeeded_keys())


def reserve_store(index: BoundedIndex[L], job: Job, size: int, *,
                  delete: Callable[[list[bytes]], object],
                  plan: Callable[[Reservation[L]], object] | None = None,
                  stats: StatsRecorder | None = None) -> list[int]:
    """The head of a store's start hook: room for each of `job`'s keys, `size`
    bytes each, reserved in `index`. `job.state` becomes `plan(reservation)` (the
    reservation itself without `plan`) at once; the entries evicted for the room
    are counted in `stats` and their keys passed to `delete` (delete their
    storage); a key held already succeeds, one that does not fit fails `full`.
    Returns the indices of the keys reserved, in order: the caller copies them (or
    settles those it refuses: their room is given back when the reservation
    closes)."""
    room = index.reserve([(k, size) for k in job.keys])
    job.state = room if plan is None else plan(room)
    if room.evicted:
        if stats is not None:
            stats.evicted(len(room.evicted))
        delete([k for k, _ in room.evicted])
    todo = []
    for i, verdict in enumerate(room.verdicts):
        if verdict is Verdict.RESERVED:
            todo.append(i)
        elif verdict is Verdict.PRESENT:
            job.succeed(i)
        else:  # only pinned entries or the job's own are left
            job.fail(i, FailureReason.FULL)
    return todo
