"""`NixlReads`: a puller's NIXL READs from one peer, batched and pipelined.

A fetch whose `TransferDone` arrived (the server pinned its blocks) queues its
READ here (`start`, called as the reply is read). A pump per transfer stream (a
copier thread moving on its own NIXL agent) takes the queued READs in turn, each
one transfer request: with several streams, several fetches move at once (a copy
within one host is CPU work; two streams use two cores), each stream verifying
what it moved (xxh3 in the puller's slots, against the checksums the server sent,
while the bytes are fresh); with one stream, the pump hands each fetch's blocks
to another copier thread to verify and goes on with the next READ. No READ waits
for a thread to wake up while a pump runs.

A fetch's outcomes are settled only after its blocks were verified (or the READ
failed): `finish` returns then (or raises what the pool raised for a slot), or,
cancelled, returns only once no thread touches its slots (a READ not begun yet
is taken out of the queue instead; `abandon` does the same for a READ nobody
awaits).

Threads: `start`, `finish`, `abandon` on the link's event loop; the pumps and the
verifications on the copier executor (never the loop, never the scheduler
thread). The queue is shared under a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeAlias

from kvtiers.integrity import checksum_slots
from kvtiers.jobs import FailureReason
from kvtiers.pool_view import PoolView
from kvtiers.sdk.job import Outcome

from kvtiers_p2p.nixl_plane import NixlPlane
from kvtiers_p2p.protocol import DataPlane, State, TransferDone
from kvtiers_p2p.verdicts import mark_corrupt, outcomes_of

__all__ = ["Landing", "NixlReads"]


@dataclass(slots=True)
class _Read:
    """One fetch's READ: the server's slots and ours (one pair per block), the
    index of each block's key in the fetch, the checksums, and where its
    outcomes go."""

    remote: tuple[str, DataPlane]
    theirs: Sequence[int]
    ours: Sequence[int]
    keys: Sequence[int]
    sums: Sequence[int]
    out: list[Outcome]
    deadline: float  # time.monotonic()
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Outcome]]
    taken: bool = field(default=False)
    error: BaseException | None = field(default=None)


#: what `NixlReads.start` gives `finish`: the READ queued, or the outcomes already
Landing: TypeAlias = "_Read | list[Outcome]"


class NixlReads:
    """READs from the peer at `endpoint` into `pool`, on `executor`'s threads."""

    def __init__(self, plane: NixlPlane, pool: PoolView, executor: Executor, *,
                 endpoint: str, logger: logging.Logger):
        self._plane = plane
        self._pool = pool
        self._executor = executor
        self._endpoint = endpoint
        self._log = logger
        self._lock = threading.Lock()
        self._queue: list[_Read] = []
        self._idle = list(range(plane.streams))  # streams no pump is moving on

    def start(self, remote: tuple[str, DataPlane], done: TransferDone,
              slots: Sequence[int], timeout: float) -> Landing:
        """Queue the READ of what `done` shipped into `slots`, at once (the loop
        thread, as the reply is read: no turn of the loop in between); what
        `finish` takes - the outcomes already when there is nothing to read."""
        n = len(slots)
        states, present = done.states, State.PRESENT
        every = states.count(present) == n  # the common case: C-speed checks only
        shipped: Sequence[int] = (range(n) if every else
                                  [i for i, state in enumerate(states) if state == present])
        if len(states) != n or len(done.source_slots) != len(shipped) or len(
                done.checksums) != len(shipped) or (shipped and max(
                done.source_slots) >= remote[1].num_slots):
            self._log.warning("peer %s: a malformed transfer (%d states, %d source slots "
                              "for %d keys); its keys fail", self._endpoint,
                              len(states), len(done.source_slots), n)
            return [FailureReason.IO] * n
        out = outcomes_of(states)
        if not shipped:
            return out
        loop = asyncio.get_running_loop()
        item = _Read(remote, done.source_slots, slots if every else [slots[i] for i in shipped],
                     shipped, done.checksums, out, time.monotonic() + timeout, loop,
                     loop.create_future())
        with self._lock:
            self._queue.append(item)
            stream = self._idle.pop() if self._idle else None
        if stream is not None:
            try:
                self._executor.submit(self._pump, stream)
            except RuntimeError:  # the executor is shut down: nothing will read
                with self._lock:
                    self._idle.append(stream)
                    self._queue.remove(item)
                return [FailureReason.IO if o is None else o for o in out]
        return item

    async def finish(self, landing: Landing) -> list[Outcome]:
        """The outcomes of a READ `start` queued, once its blocks are verified (or
        it failed). Cancelled, it returns only once no thread touches the slots
        (a READ not begun yet is taken out of the queue instead)."""
        if isinstance(landing, list):
            return landing
        try:
            return await asyncio.shield(landing.future)
        except asyncio.CancelledError:
            await self.abandon(landing)
            raise

    async def abandon(self, landing: Landing) -> None:
        """Nobody waits for this READ any more: take it out of the queue, or wait
        until the thread moving it let go of its slots."""
        if isinstance(landing, list):
            return
        with self._lock:
            queued = not landing.taken
            if queued:
                self._queue.remove(landing)
        if not queued:
            await asyncio.wait([landing.future])

    # Copier threads.

    def _pump(self, stream: int) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._idle.append(stream)
                    return
                r = self._queue.pop(0)
                r.taken = True
            try:
                self._move(r, stream)
            except Exception:  # noqa: BLE001 - every read must settle
                self._log.exception("peer %s: a NIXL read failed", self._endpoint)
                self._settle(r, FailureReason.IO)

    def _move(self, r: _Read, stream: int) -> None:
        """One fetch's READ (one transfer request) on `stream`; then its blocks
        are verified on another copier thread while the pump goes on with the next
        READ."""
        name, plane = r.remote
        state = self._plane.read_slots(name, r.theirs, r.ours,
                                       max(r.deadline - time.monotonic(), 0.1), stream)
        if state != "DONE":
            self._log.warning("peer %s: a NIXL read ended %s; its keys fail", self._endpoint,
                              state)
            self._settle(r, FailureReason.TIMEOUT if state == "TIMEOUT" else FailureReason.IO)
            return
        if self._plane.streams > 1:  # each stream verifies what it moved
            self._verify(r)
            return
        try:
            self._executor.submit(self._verify, r)
        except RuntimeError:  # shutting down: verify here
            self._verify(r)

    def _verify(self, r: _Read) -> None:
        """Check each landed block in its slot; settles `r` whatever happens (a
        slot the pool cannot give raises out of `read`, as a copy into it would)."""
        try:
            bad = mark_corrupt(r.out, r.keys, checksum_slots(self._pool, r.ours), r.sums)
            if bad:
                self._log.warning("peer %s: %d block(s) failed verification; misses",
                                  self._endpoint, bad)
        except Exception as exc:  # noqa: BLE001 - the pool's: the caller's to handle
            r.error = exc
        finally:
            self._resolve(r)

    def _settle(self, r: _Read, reason: FailureReason) -> None:
        for i in r.keys:
            r.out[i] = reason
        self._resolve(r)

    @staticmethod
    def _resolve(r: _Read) -> None:
        def done() -> None:
            if r.future.done():
                return
            if r.error is not None:
                r.future.set_exception(r.error)
            else:
                r.future.set_result(r.out)

        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            r.loop.call_soon_threadsafe(done)
