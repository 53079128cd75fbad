"""`Pushes`: the store hooks of a p2p tier with `push` - blocks sent, with their
checksums, into a `kvtiers serve` cache node's pool.

Without `push` a store copies nothing: the block in this engine's pool is what
peers pull, and the store succeeds at once with 0 bytes moved. With it, each batch
goes to the first ready peer that takes stores; the node verifies and keeps the
blocks (`Store` / `StoreDone`). A key the node held already succeeds with 0 bytes
moved; a node that is away is REJECTED (a healthy refusal the breaker does not
count).

Threads: the hooks run on the tier's event loop; slot copies and checksums on the
tier's copier threads (`kvtiers.sdk.run_off_loop`), so the loop keeps receiving meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor

from kvtiers.sdk import (
    AsyncJobHooks,
    AsyncProbe,
    BlockKey,
    FailureReason,
    Job,
    Outcome,
    PoolView,
    StatsRecorder,
    checksum,
    run_off_loop,
)

from kvtiers_p2p.pull.link import PeerLink
from kvtiers_p2p.wire.protocol import State

__all__ = ["Pushes"]


class Pushes:
    """The store hooks (`hooks`) of one tier. `links`: the tier's peers by endpoint
    (read, never changed here); `remember(key, link)`: the tier's memory of which
    peer holds a key (for its loads); `timeout(job)`: seconds a request of `job`
    may take. `usage_bytes`: the node's pool usage, as its last `StoreDone` said."""

    def __init__(self, *, push: bool, pool: PoolView, links: Mapping[str, PeerLink],
                 copier: Executor, probe: AsyncProbe, stats: StatsRecorder,
                 remember: Callable[[BlockKey, PeerLink], None],
                 forget: Callable[[BlockKey], object],
                 timeout: Callable[[Job], float]):
        self.push = push
        self.usage_bytes = 0
        self._pool, self._links, self._copier = pool, links, copier
        self._probe, self._stats = probe, stats
        self._remember, self._forget, self._timeout = remember, forget, timeout
        self._held: dict[int, list[int]] = {}  # store job id -> keys held already
        self.hooks = AsyncJobHooks(block=self._one, batch=self._batch, start=self._start,
                                   end=self._end)

    def _start(self, job: Job) -> list[int]:
        if self.push:
            return list(range(len(job.keys)))
        for i in range(len(job.keys)):
            job.succeed(i, 0)
        return []

    async def _batch(self, job: Job, indices: Sequence[int]) -> list[Outcome]:
        link = next((x for x in self._links.values() if x.ready and x.accepts_stores), None)
        if link is None:
            return [FailureReason.REJECTED] * len(indices)
        keys = [job.keys[i] for i in indices]
        blocks, sums = await run_off_loop(self._copier, self._read_slots,
                                      [job.slots[i] for i in indices])
        outcomes, done = await link.push(keys, blocks, sums, self._timeout(job))
        if done is not None:
            self.usage_bytes = done.usage_bytes
            for key in done.evicted:
                self._forget(key)
                self._probe.record(key, False)
            if done.evicted:
                self._stats.evicted(len(done.evicted))
            held = self._held.setdefault(job.job_id, [])
            for i, key, outcome, state in zip(indices, keys, outcomes, done.states,
                                              strict=True):
                if outcome is None:
                    self._remember(key, link)
                    self._probe.record(key, True)
                    if state == State.HELD:
                        held.append(i)
        return outcomes

    async def _one(self, job: Job, i: int) -> Outcome:
        return (await self._batch(job, [i]))[0]

    def _read_slots(self, slots: list[int]) -> tuple[list[bytes], list[int]]:
        """A copy of each slot's block and its checksum (a copier thread)."""
        block = self._pool.block
        copies = [bytes(block(slot)) for slot in slots]
        return copies, [checksum(c) for c in copies]

    def _end(self, job: Job) -> None:
        for i in self._held.pop(job.job_id, ()):
            if job.succeeded(i):
                job.succeed(i, 0)
