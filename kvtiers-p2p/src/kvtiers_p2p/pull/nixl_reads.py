"""`NixlReads`: a puller's NIXL READs from one peer, batched and pipelined.

A fetch whose `TransferDone` arrived (the server pinned its blocks) queues its
READ here (`start`, called as the reply is read), cut into pieces of
`PIECE_BYTES`. A pump per transfer stream (a copier thread moving on its own NIXL
agent) takes the queued pieces in turn, each one transfer request: with several
streams, several pieces move at once (a copy within one host is CPU work; two
streams use two cores) and the streams end together, each verifying what it moved
(xxh3 in the puller's slots, against the checksums the server sent, while the
bytes are fresh); with one stream, the pump hands each piece's blocks to another
copier thread to verify and goes on with the next. No READ waits for a thread to
wake up while a pump runs.

A fetch's outcomes are settled only after all its pieces were verified (or their
READs failed): `finish` returns then (or raises what the pool raised for a slot),
or, cancelled, returns only once no thread touches its slots (pieces not begun yet
are taken out of the queue instead; `abandon` does the same for a READ nobody
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
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeAlias

from kvtiers.sdk import FailureReason, Outcome, PoolView, checksum_slots

from kvtiers_p2p.pull.verdicts import mark_corrupt, outcomes_of
from kvtiers_p2p.wire.nixl_plane import NixlPlane
from kvtiers_p2p.wire.protocol import DataPlane, State, TransferDone

__all__ = ["Landing", "NixlReads"]


@dataclass(slots=True)
class _Read:
    """One fetch's READ: the server's slots and ours (one pair per block), the
    index of each block's key in the fetch, the checksums, and where its
    outcomes go; moved in `pieces` (`_Piece`), `left` of them not settled yet."""

    remote: tuple[str, DataPlane]
    theirs: Sequence[int]
    ours: Sequence[int]
    keys: Sequence[int]
    sums: Sequence[int]
    out: list[Outcome]
    deadline: float  # time.monotonic()
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Outcome]]
    left: int = field(default=0)
    error: BaseException | None = field(default=None)


@dataclass(slots=True)
class _Piece:
    """Blocks [lo, hi) of a fetch's READ: one transfer request, verified by
    whoever moved it (a piece out of the queue is a pump's: it touches those
    slots until it is settled)."""

    read: _Read
    lo: int
    hi: int

    def part(self, items: Sequence[int]) -> Sequence[int]:
        """This piece's span of one of the read's per-block lists (the list
        itself, no copy, when the piece is the whole read)."""
        if self.lo == 0 and self.hi == len(items):
            return items
        return items[self.lo:self.hi]


#: what `NixlReads.start` gives `finish`: the READ queued, or the outcomes already
Landing: TypeAlias = "_Read | list[Outcome]"


#: bytes of a READ's pieces (`piece_blocks`): smaller READs cost more per byte
#: (a transfer request's set-up; 256 KiB ones moved at 0.6 of 2 MiB ones here),
#: larger ones verify colder (the bytes no longer in cache) and end unevenly
PIECE_BYTES = 4 << 20


def piece_blocks(block_bytes: int) -> int:
    """Blocks per piece of a READ: `PIECE_BYTES` of them, at least one."""
    return max(1, PIECE_BYTES // max(block_bytes, 1))


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
        self._queue: deque[_Piece] = deque()
        self._idle = list(range(plane.streams))  # streams no pump is moving on
        self._piece = piece_blocks(pool.block_bytes)
        #: blocks of a pipelined load's first fetch: a piece for every stream
        self.first_fetch = self._piece * plane.streams

    def start(self, remote: tuple[str, DataPlane], done: TransferDone,
              slots: Sequence[int], timeout: float) -> Landing:
        """Queue the READ of what `done` shipped into `slots`, at once (the loop
        thread, as the reply is read: no turn of the loop in between), cut into
        pieces that every idle stream starts on; what `finish` takes - the
        outcomes already when there is nothing to read."""
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
        m, step = len(shipped), self._piece
        pieces = [_Piece(item, lo, min(lo + step, m)) for lo in range(0, m, step)]
        item.left = len(pieces)
        with self._lock:
            self._queue.extend(pieces)
            streams = self._idle[:len(pieces)]
            del self._idle[:len(streams)]
        for i, stream in enumerate(streams):
            try:
                self._executor.submit(self._pump, stream)
            except RuntimeError:  # the executor is shut down: nothing will read
                with self._lock:
                    self._idle.extend(streams[i:])
                    if i == 0:  # no pump runs: nothing of this fetch was taken
                        for piece in pieces:
                            self._queue.remove(piece)
                        return [FailureReason.IO if o is None else o for o in out]
                break  # a pump runs: it moves every piece
        return item

    async def finish(self, landing: Landing) -> list[Outcome]:
        """The outcomes of a READ `start` queued, once its blocks are verified (or
        it failed). Cancelled, it returns only once no thread touches the slots
        (pieces not begun yet are taken out of the queue instead)."""
        if isinstance(landing, list):
            return landing
        try:
            return await asyncio.shield(landing.future)
        except asyncio.CancelledError:
            await self.abandon(landing)
            raise

    async def abandon(self, landing: Landing) -> None:
        """Nobody waits for this READ any more: take its pieces out of the queue,
        and wait until the threads moving the others let go of their slots."""
        if isinstance(landing, list):
            return
        with self._lock:
            mine = [p for p in self._queue if p.read is landing]
            for piece in mine:
                self._queue.remove(piece)
            landing.left -= len(mine)
            settled = landing.left == 0
        if settled:
            self._resolve(landing)
        await asyncio.wait([landing.future])

    # Copier threads.

    def _pump(self, stream: int) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._idle.append(stream)
                    return
                piece = self._queue.popleft()
            try:
                self._move(piece, stream)
            except Exception:  # noqa: BLE001 - every read must settle
                self._log.exception("peer %s: a NIXL read failed", self._endpoint)
                self._settle(piece, FailureReason.IO)

    def _move(self, piece: _Piece, stream: int) -> None:
        """One piece's READ (one transfer request) on `stream`; then its blocks are
        verified - by this pump with several streams, else on another copier
        thread while the pump goes on with the next piece."""
        r = piece.read
        state = self._plane.read_slots(r.remote[0], piece.part(r.theirs), piece.part(r.ours),
                                       max(r.deadline - time.monotonic(), 0.1), stream)
        if state != "DONE":
            self._log.warning("peer %s: a NIXL read ended %s; its keys fail", self._endpoint,
                              state)
            self._settle(piece, FailureReason.TIMEOUT if state == "TIMEOUT"
                         else FailureReason.IO)
            return
        if self._plane.streams > 1:  # each stream verifies what it moved
            self._verify(piece)
            return
        try:
            self._executor.submit(self._verify, piece)
        except RuntimeError:  # shutting down: verify here
            self._verify(piece)

    def _verify(self, piece: _Piece) -> None:
        """Check each landed block of `piece` in its slot; settles it whatever
        happens (a slot the pool cannot give raises out of `read`, as a copy into
        it would)."""
        r = piece.read
        try:
            bad = mark_corrupt(r.out, piece.part(r.keys),
                               checksum_slots(self._pool, piece.part(r.ours)),
                               piece.part(r.sums))
            if bad:
                self._log.warning("peer %s: %d block(s) failed verification; misses",
                                  self._endpoint, bad)
        except Exception as exc:  # noqa: BLE001 - the pool's: the caller's to handle
            r.error = exc
        finally:
            self._done(piece)

    def _settle(self, piece: _Piece, reason: FailureReason) -> None:
        r = piece.read
        for i in piece.part(r.keys):
            r.out[i] = reason
        self._done(piece)

    def _done(self, piece: _Piece) -> None:
        """`piece` is settled: no thread touches its slots any more."""
        r = piece.read
        with self._lock:
            r.left -= 1
            last = r.left == 0
        if last:
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
