"""`NixlReads`: a puller's NIXL READs from one peer, batched and pipelined.

A fetch whose `TransferDone` arrived (the server pinned its blocks) queues its
READ here. One copier thread at a time (the pump) takes the queued READs in
turn, each one transfer request, hands each fetch's blocks to another copier
thread to verify (xxh3 in the puller's slots, against the checksums the server
sent) and goes on with the next: the copies of a pipelined load run back to
back, each verified while the next one moves, and no READ waits for a thread to
wake up (the plane's agent moves one transfer at a time anyway).

A fetch's outcomes are settled only after its blocks were verified (or the READ
failed): `read` returns then (or raises what the pool raised for a slot), or,
cancelled, returns only once no thread touches its slots (a READ not begun yet
is taken out of the queue instead).

Threads: `read` on the link's event loop; the pump and the verifications on the
copier executor (never the loop, never the scheduler thread). The queue is
shared under a lock.
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

from kvtiers.integrity import checksum
from kvtiers.jobs import FailureReason
from kvtiers.pool_view import PoolView
from kvtiers.sdk.job import Outcome

from kvtiers_p2p.nixl_plane import NixlPlane
from kvtiers_p2p.protocol import DataPlane, State, TransferDone

__all__ = ["NixlReads"]


@dataclass(slots=True)
class _Read:
    """One fetch's READ: its (server slot, our slot) pairs, the index of each
    pair's key in the fetch, the checksums, and where its outcomes go."""

    remote: tuple[str, DataPlane]
    pairs: list[tuple[int, int]]
    keys: list[int]
    sums: list[int]
    out: list[Outcome]
    deadline: float  # time.monotonic()
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Outcome]]
    taken: bool = field(default=False)
    error: BaseException | None = field(default=None)


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
        self._pumping = False

    async def read(self, remote: tuple[str, DataPlane], done: TransferDone,
                   slots: Sequence[int], timeout: float) -> list[Outcome]:
        """Land the blocks `done` shipped into `slots` (one per key of the fetch)
        and verify them: one outcome per key (None: landed and verified), within
        `timeout`. Loop thread."""
        n = len(slots)
        shipped = [i for i, state in enumerate(done.states) if state == State.PRESENT]
        if len(done.states) != n or len(done.source_slots) != len(shipped) or len(
                done.checksums) != len(shipped) or any(
                s >= remote[1].num_slots for s in done.source_slots):
            self._log.warning("peer %s: a malformed transfer (%d states, %d source slots "
                              "for %d keys); its keys fail", self._endpoint,
                              len(done.states), len(done.source_slots), n)
            return [FailureReason.IO] * n
        out: list[Outcome] = [None if st == State.PRESENT else FailureReason.REJECTED
                              if st == State.REFUSED else FailureReason.MISSING
                              for st in done.states]
        if not shipped:
            return out
        loop = asyncio.get_running_loop()
        item = _Read(remote, [(src, slots[i]) for src, i in zip(done.source_slots, shipped,
                                                                  strict=True)],
                     shipped, list(done.checksums), out, time.monotonic() + timeout, loop,
                     loop.create_future())
        with self._lock:
            self._queue.append(item)
            start, self._pumping = not self._pumping, True
        if start:
            try:
                self._executor.submit(self._pump)
            except RuntimeError:  # the executor is shut down: nothing will read
                with self._lock:
                    self._pumping = False
                    self._queue.remove(item)
                return [FailureReason.IO if o is None else o for o in out]
        try:
            return await asyncio.shield(item.future)
        except asyncio.CancelledError:
            with self._lock:
                queued = not item.taken
                if queued:
                    self._queue.remove(item)
            if not queued:  # a thread has its slots: wait until it let go
                await asyncio.wait([item.future])
            raise

    # Copier threads.

    def _pump(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._pumping = False
                    return
                r = self._queue.pop(0)
                r.taken = True
            try:
                self._move(r)
            except Exception:  # noqa: BLE001 - every read must settle
                self._log.exception("peer %s: a NIXL read failed", self._endpoint)
                self._settle(r, FailureReason.IO)

    def _move(self, r: _Read) -> None:
        """One fetch's READ (one transfer request); then its blocks are verified
        on another copier thread while the pump goes on with the next READ."""
        name, plane = r.remote
        state = self._plane.read(name, plane, r.pairs, max(r.deadline - time.monotonic(), 0.1))
        if state != "DONE":
            self._log.warning("peer %s: a NIXL read ended %s; its keys fail", self._endpoint,
                              state)
            self._settle(r, FailureReason.TIMEOUT if state == "TIMEOUT" else FailureReason.IO)
            return
        try:
            self._executor.submit(self._verify, r)
        except RuntimeError:  # shutting down: verify here
            self._verify(r)

    def _verify(self, r: _Read) -> None:
        """Check each landed block in its slot; settles `r` whatever happens (a
        slot the pool cannot give raises out of `read`, as a copy into it would)."""
        block = self._pool.block
        out = r.out
        bad = 0
        try:
            for (_, slot), i, want in zip(r.pairs, r.keys, r.sums, strict=True):
                if checksum(block(slot)) != want:
                    out[i] = FailureReason.CORRUPT
                    bad += 1
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
