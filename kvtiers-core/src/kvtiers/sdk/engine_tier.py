"""`EngineTier`: a `SecondaryTier` whose I/O runs on one of the SDK's job engines
(`JobEngine` on threads, `AsyncJobEngine` on an event loop), so that the contract's
`get_finished_jobs` and `drain` are the engine's, written once.

The subclass sets `engine` in its constructor, before the tier is used, and
implements the rest of the contract: `lookup`, `submit_store`, `submit_load` (with
whatever state its hooks need), `stats` and `close`, which calls the engine's
`close` among the tier's own clean-up. A tier whose holdings are one
`BoundedIndex` takes `IndexedTier` (`kvtiers.sdk.indexed_tier`) instead, which
adds `submit_*` and `touch`.

Threads: `get_finished_jobs` is the scheduler thread's and never blocks (a list
swap under the engine's lock); `drain` waits (real time) on any thread but the
engine's own.
"""

from __future__ import annotations

from typing import Any

from kvtiers.contract.jobs import JobResult
from kvtiers.contract.tier import SecondaryTier
from kvtiers.sdk.engine_front import EngineFront

__all__ = ["EngineTier"]


class EngineTier(SecondaryTier):
    """See the module doc."""

    #: the tier's job engine, set by the subclass's constructor (which may declare
    #: the narrower type: `engine: JobEngine`)
    engine: EngineFront[Any]

    def get_finished_jobs(self) -> list[JobResult]:
        return self.engine.take_finished()

    def drain(self, timeout: float | None = None) -> bool:
        return self.engine.drain(timeout)
