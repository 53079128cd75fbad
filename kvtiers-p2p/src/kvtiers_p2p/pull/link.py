"""`PeerLink`: the request verbs of a puller's session with one peer's server -
`lookup`, `fetch`, `push`, `touch` - on a `PeerSession` (`kvtiers_p2p.pull.session`:
the supervisor that keeps the session up and matches replies to requests).

Everything here runs on the session's event loop (the p2p tier's
`AsyncJobEngine` loop).

`lookup` and `fetch` never wait longer than their timeout, and answer at once
while the session is not ready. On the NIXL plane a lookup asks for a lease
(`lease_s`, when the pin budget has room): the server pins what it holds and
says where, and a load of those keys READs them without a fetch round trip
(`kvtiers_p2p.pull.leases`). `fetch` writes the blocks into the puller's slots
and verifies each block's checksum there before calling it a success; a block
whose bytes do not match is `corrupt`. When `fetch` returns, nothing of this link
can touch those slots any more: a late reply for a request given up is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Executor
from typing import Any

import zmq
import zmq.asyncio
from kvtiers.sdk import BlockKey, FailureReason, Outcome, PoolView, land_slots, run_off_loop

from kvtiers_p2p.pull.leases import Leases, Taken
from kvtiers_p2p.pull.nixl_reads import NixlReads
from kvtiers_p2p.pull.session import LinkDown, LinkOptions, PeerSession, WaitTimeout, within
from kvtiers_p2p.pull.verdicts import mark_corrupt, outcomes_of
from kvtiers_p2p.wire.codec import ProtocolError, encode
from kvtiers_p2p.wire.nixl_plane import NixlPlane
from kvtiers_p2p.wire.protocol import (
    MAX_KEYS,
    Abort,
    Fetch,
    Hello,
    Landed,
    Lookup,
    LookupReply,
    State,
    Store,
    StoreDone,
    Touch,
    TransferDone,
)
from kvtiers_p2p.wire.security import CurveKeys

__all__ = ["PeerLink", "fetch_bounds", "nixl_fetch_bounds"]

_DEFAULTS = LinkOptions()


def fetch_bounds(n: int, chunk: int) -> list[int]:
    """Where a load of `n` blocks is cut into fetches of at most `chunk` blocks.
    The first is small (1/32 of a chunk) and each next one twice the one before:
    the first blocks move after a short round trip, and the server pins each
    fetch (faster per block than it moves) while the one before moves. Then
    fetches of `chunk`, none more than half of what is left: the last ones
    shrink, so the streams moving them end about together."""
    floor = max(1, chunk // 32)
    bounds = [0]
    size = floor
    while bounds[-1] < n:
        left = n - bounds[-1]
        if size >= chunk:
            size = min(chunk, max(floor, left // 2))
        if left - size < floor and left <= chunk:
            size = left  # no sliver at the end
        bounds.append(bounds[-1] + size)
        size = min(chunk, size * 2)
    return bounds


def nixl_fetch_bounds(n: int, max_fetch: int, first: int) -> list[int]:
    """Where a NIXL load of `n` blocks (more than one fetch's chunk) is cut: a
    first fetch of `first` blocks (a piece for each transfer stream, so that every
    stream starts after one short round trip), then the rest in fetches of up to
    `max_fetch` (the server pins each in one call; this side cuts their READs into
    pieces itself, so fewer, larger fetches cost both sides less)."""
    first = max(1, min(first, max_fetch))
    if first >= n:
        return [0, n]
    return [0, *range(first, n, max_fetch), n]


class PeerLink(PeerSession):
    """The session with the server at `endpoint`, and the requests made on it.
    Build, `start` and `close` on the loop's thread (or through the loop)."""

    def __init__(self, endpoint: str, hello: Hello, pool: PoolView, *,
                 context: zmq.asyncio.Context, options: LinkOptions = _DEFAULTS,
                 curve: CurveKeys | None = None, logger: logging.Logger | None = None,
                 lander: Executor | None = None, nixl: NixlPlane | None = None):
        super().__init__(endpoint, hello, context=context, options=options, curve=curve,
                         logger=logger, nixl=nixl)
        # Where arriving blocks are copied into their slots and verified: threads,
        # so the loop goes on receiving meanwhile (None: on the loop).
        self._lander = lander
        self._pool = pool
        # NIXL: the READs of this link's fetches, batched (`NixlReads`)
        self._reads = (NixlReads(nixl, pool, lander, endpoint=endpoint, logger=self._log)
                       if nixl is not None and lander is not None else None)
        # NIXL fetches waiting for their reply: their slots and deadline (monotonic)
        self._reading: dict[int, tuple[Sequence[int], float]] = {}
        self._in_flight = 0  # blocks of fetches in flight (`_budget`)
        self._room = asyncio.Condition()
        #: this session's leases (NIXL): they hold pin budget too
        self.leases = Leases()

    # Requests (loop thread).

    async def lookup(self, keys: Sequence[BlockKey]) -> bytes | None:
        """One `State` byte per key, or None (not ready, timed out, rejected).
        NIXL, with room in the pin budget: what the server holds is leased for
        this side's loads (`leases`)."""
        if not self.ready or not keys:
            return None
        req, future = self._request()
        lease_s = 0.0
        if self._opt.lease_s > 0 and self._remote is not None and self._reads is not None and (
                self._in_flight + self.leases.blocks + len(keys) <= self.max_fetch):
            lease_s = self._opt.lease_s
        sent = time.monotonic()
        try:
            assert self._sock is not None
            await self._sock.send(encode(Lookup(req, list(keys), lease_s)), zmq.NOBLOCK)
            reply: LookupReply = await within(future, self._opt.lookup_timeout_s)
        except (WaitTimeout, LinkDown, ProtocolError, zmq.ZMQError):
            # A lease granted after this gave up: the server ends it (`Abort`, or
            # its own timeout); the reply itself is dropped as a late one.
            if lease_s:
                self._abort(req)
            return None
        finally:
            self._pending.pop(req, None)
        if reply.lease_s and (not lease_s or len(reply.states) != len(keys)):
            self._abort(req)  # not asked for, or not of this lookup: given back
        elif reply.lease_s:
            for old in self.leases.grant(reply, keys, sent):
                self._abort(old)
        return reply.states if len(reply.states) == len(keys) else None

    async def fetch(self, keys: Sequence[BlockKey], slots: Sequence[int],
                    timeout: float) -> list[Outcome]:
        """Pull `keys` into `slots` of the pool; one outcome per key, within one
        `timeout` in all. Up to `chunk_bytes` (and the server's `max_fetch`, its
        pin budget for this peer): one fetch, every block pinned until the load
        ends. More: pipelined, fetches in flight together (the server pins and
        ships one while this side lands the one before), never more blocks at
        once on this link than `max_fetch` - cut by `nixl_fetch_bounds` on the
        NIXL plane (its READs are cut into pieces this side), by `fetch_bounds`
        on ZeroMQ frames."""
        if self.leases.blocks and self._remote is not None and self._reads is not None:
            taken = self.leases.take(keys, time.monotonic())
            if taken is not None:
                return await self._fetch_leased(keys, slots, timeout, taken)
        return await self._fetch_unleased(keys, slots, timeout)

    async def _fetch_unleased(self, keys: Sequence[BlockKey], slots: Sequence[int],
                              timeout: float) -> list[Outcome]:
        n = len(keys)
        chunk = max(1, min(self.max_fetch,
                           self._opt.chunk_bytes // max(self._pool.block_bytes, 1)))
        if n <= chunk:  # one fetch: every block pinned at once, until the load ends
            async with self._budget(n):
                return await self._fetch(keys, slots, timeout)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout

        async def part(first: int, size: int) -> list[Outcome]:
            async with self._budget(size):
                return await self._fetch(keys[first:first + size], slots[first:first + size],
                                         end - loop.time())

        if self._reads is not None and self._remote is not None:
            bounds = nixl_fetch_bounds(n, self.max_fetch, self._reads.first_fetch)
        else:
            bounds = fetch_bounds(n, chunk)
        # Every part ends before this returns (or raises the first part's error):
        # nothing of this load may touch its slots after it.
        parts = await asyncio.gather(*(part(a, b - a)
                                       for a, b in itertools.pairwise(bounds)),
                                     return_exceptions=True)
        out: list[Outcome] = []
        for outcomes in parts:
            if isinstance(outcomes, BaseException):
                raise outcomes
            out.extend(outcomes)
        return out

    async def _fetch_leased(self, keys: Sequence[BlockKey], slots: Sequence[int],
                            timeout: float, taken: Taken) -> list[Outcome]:
        """Pull `keys`, the ones `taken` leased READ from where the lease says (no
        round trip), the rest fetched; the leases are released when both ended."""
        assert self._reads is not None and self._remote is not None
        reads, remote = self._reads, self._remote

        async def read(ours: Sequence[int]) -> list[Outcome]:
            done = TransferDone(0, bytes([State.PRESENT]) * len(ours), taken.sums,
                                taken.slots)
            return await reads.finish(reads.start(remote, done, ours, timeout))

        try:
            if taken.at is None:  # every key, in order
                return await read(slots)
            at = taken.at
            rest = sorted(set(range(len(keys))).difference(at))
            # Both end before this returns (or raises the first error): nothing of
            # this load may touch its slots after it.
            leased, fetched = await asyncio.gather(
                read([slots[i] for i in at]),
                self._fetch_unleased([keys[i] for i in rest], [slots[i] for i in rest],
                                     timeout) if rest else asyncio.sleep(0, []),
                return_exceptions=True)
            if isinstance(leased, BaseException):
                raise leased
            if isinstance(fetched, BaseException):
                raise fetched
            out: list[Outcome] = [None] * len(keys)
            for i, outcome in zip(at, leased, strict=True):
                out[i] = outcome
            for i, outcome in zip(rest, fetched, strict=True):
                out[i] = outcome
            return out
        finally:
            released = self.leases.finish(taken.leases)
            for req in released:
                self._landed(req)
            if released:
                self._room_changed()

    def _room_changed(self) -> None:
        """Leases gave budget back: wake the fetches waiting for room."""
        async def notify() -> None:
            async with self._room:
                self._room.notify_all()

        asyncio.get_running_loop().create_task(notify())

    @contextlib.asynccontextmanager
    async def _budget(self, blocks: int) -> AsyncIterator[None]:
        """Hold `blocks` of the server's pin budget for this link while a fetch is
        in flight (fetches wait their turn, oldest first). Leases no load took give
        their share back first."""
        blocks = min(blocks, self.max_fetch)
        async with self._room:
            while self._in_flight + self.leases.blocks + blocks > self.max_fetch:
                idle = self.leases.idle(
                    self._in_flight + self.leases.blocks + blocks - self.max_fetch)
                for req in idle:
                    self._abort(req)
                if not idle:
                    await self._room.wait()
            self._in_flight += blocks
        try:
            yield
        finally:
            async with self._room:
                self._in_flight -= blocks
                self._room.notify_all()

    async def _fetch(self, keys: Sequence[BlockKey], slots: Sequence[int],
                     timeout: float) -> list[Outcome]:
        n = len(keys)
        if not self.ready:
            return [FailureReason.IO] * n
        if timeout <= 0:
            return [FailureReason.TIMEOUT] * n
        req, future = self._request()
        nixl = self._remote is not None and self._reads is not None
        if nixl:  # the reply's READ is queued as it is read (`_dispatch`)
            self._reading[req] = (slots, time.monotonic() + timeout)
        try:
            assert self._sock is not None
            await self._sock.send(encode(Fetch(req, list(keys), list(slots))), zmq.NOBLOCK)
            done, landing = await within(future, timeout)
        except WaitTimeout:
            self._abort(req)
            return [FailureReason.TIMEOUT] * n
        except (LinkDown, ProtocolError, zmq.ZMQError):
            return [FailureReason.IO] * n
        except asyncio.CancelledError:  # a READ queued already must let go first
            if nixl and future.done() and not future.cancelled() and (
                    future.exception() is None):
                assert self._reads is not None
                await self._reads.abandon(future.result()[1])
            raise
        finally:
            self._pending.pop(req, None)
            self._reading.pop(req, None)
        try:
            if nixl:  # the NIXL plane: READ and verified on the copier threads
                assert self._reads is not None
                return await self._reads.finish(landing)
            if self._lander is None:
                return self._land(done, landing, slots)
            return await run_off_loop(self._lander, self._land, done, landing, slots)
        finally:
            if done.checksums:
                self._landed(req)

    async def push(self, keys: Sequence[BlockKey], blocks: Sequence[bytes],
                   sums: Sequence[int], timeout: float
                   ) -> tuple[list[Outcome], StoreDone | None]:
        """Have a server that `accepts_stores` keep `blocks` (copies of the slots,
        one per key, `sums` their checksums): one outcome per key (None: held there
        now, copied or held already: `done.states` says which), and the server's
        `StoreDone` (None when none came)."""
        n = len(keys)
        if not self.ready or not self.accepts_stores:
            return [FailureReason.REJECTED] * n, None
        if timeout <= 0:
            return [FailureReason.TIMEOUT] * n, None
        req, future = self._request()
        try:
            assert self._sock is not None
            header = encode(Store(req, list(keys), list(sums)))
            await self._sock.send_multipart([header, *blocks], zmq.NOBLOCK, copy=False)
            done: StoreDone = await within(future, timeout)
        except WaitTimeout:
            return [FailureReason.TIMEOUT] * n, None
        except (LinkDown, ProtocolError, zmq.ZMQError):
            return [FailureReason.IO] * n, None
        finally:
            self._pending.pop(req, None)
        if len(done.states) != n:
            return [FailureReason.IO] * n, None
        return [None if st in (State.PRESENT, State.HELD) else FailureReason.CORRUPT
                if st == State.CORRUPT else FailureReason.FULL for st in done.states], done

    def touch(self, keys: Sequence[BlockKey]) -> None:
        """Tell a server that `accepts_stores` these blocks were used (loop thread;
        no reply, dropped when the link is down)."""
        if self.accepts_stores and keys:
            self._post(Touch(list(keys)[:MAX_KEYS]))

    def _landed(self, req: int) -> None:
        """Tell the server the blocks of `req` are in (it unpins them)."""
        self._post(Landed(req))

    def _abort(self, req: int) -> None:
        self._post(Abort(req))

    def _land(self, done: TransferDone, frames: list[zmq.Frame],
              slots: Sequence[int]) -> list[Outcome]:
        n = len(slots)
        shipped = done.states.count(State.PRESENT)
        bb = self._pool.block_bytes
        if len(done.states) != n or len(frames) != shipped or any(
                len(f.buffer) != bb for f in frames):
            self._log.warning("peer %s: a malformed transfer (%d states, %d frames for %d "
                              "keys); its keys fail", self.endpoint, len(done.states),
                              len(frames), n)
            return [FailureReason.IO] * n
        out = outcomes_of(done.states)
        if not shipped:
            return out
        shipped_at = ([i for i, st in enumerate(done.states) if st == State.PRESENT]
                      if shipped < n else range(n))
        # Copied into the slots and summed there, in one call (C, without the GIL).
        sums = land_slots(self._pool, [slots[i] for i in shipped_at],
                          [f.buffer for f in frames])
        bad = mark_corrupt(out, shipped_at, sums, done.checksums)
        if bad:
            self._log.warning("peer %s: %d block(s) failed verification; misses",
                              self.endpoint, bad)
        return out

    # The session's hooks.

    def _transferred(self, done: TransferDone, frames: list[zmq.Frame]) -> Any:
        """A NIXL fetch's READ is queued as its reply is read (the future gets it
        instead of frames)."""
        reading = self._reading.get(done.req)
        if reading is not None and self._remote is not None and self._reads is not None:
            slots, end = reading
            return done, self._reads.start(self._remote, done, slots,
                                           max(end - time.monotonic(), 0.1))
        return done, frames

    def _tick(self) -> None:
        if len(self.leases):
            lapsed = self.leases.expired(time.monotonic())
            for req in lapsed:
                self._abort(req)
            if lapsed:
                self._room_changed()

    def _ended(self) -> None:
        if len(self.leases):  # the server drops this session's pins with it
            self.leases.clear()
            self._room_changed()
