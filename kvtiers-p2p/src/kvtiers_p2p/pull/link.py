"""`PeerLink`: a puller's session with one peer's server, on an asyncio loop.

Everything here runs on one event loop (the p2p tier's `AsyncJobEngine` loop), so
the DEALER socket is only ever touched from that loop's thread.

A supervisor task keeps a session up: it opens a socket, sends `Hello`, waits for
`Welcome` (or `Refused`: logged with the server's reason, retried at the slowest
pace; the link's `state` stays "refused" until a retry is welcomed), then reads
replies and sends a `KeepAlive` every `keepalive_s`. A peer silent for
`timeout_s`, a `Disconnect`, or an error ends the session: every request waiting
on it fails at once (`LinkDown`), the socket is closed and a new
one is tried after a backoff that doubles from `reconnect_min_s` to
`reconnect_max_s` (reset by a session that reached `ready`).

`lookup` and `fetch` never wait longer than their timeout, and answer at once
while the session is not ready. On the NIXL plane a lookup asks for a lease
(`lease_s`, when the pin budget has room): the server pins what it holds and
says where, and a load of those keys READs them without a fetch round trip
(`kvtiers_p2p.leases`). `fetch` writes the blocks into the puller's slots
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
from dataclasses import dataclass
from typing import Any, cast

import zmq
import zmq.asyncio
from kvtiers.sdk import BlockKey, FailureReason, Outcome, PoolView, land_slots, run_off_loop

from kvtiers_p2p.codec import ProtocolError, decode_server, encode
from kvtiers_p2p.leases import Leases, Taken
from kvtiers_p2p.nixl_plane import NixlPlane
from kvtiers_p2p.nixl_reads import NixlReads
from kvtiers_p2p.protocol import (
    MAX_KEYS,
    Abort,
    DataPlane,
    Disconnect,
    ErrorReply,
    Fetch,
    Hello,
    KeepAlive,
    Landed,
    Lookup,
    LookupReply,
    Refused,
    State,
    Store,
    StoreDone,
    Touch,
    TransferDone,
    Welcome,
)
from kvtiers_p2p.security import CurveKeys
from kvtiers_p2p.verdicts import mark_corrupt, outcomes_of

__all__ = ["LinkDown", "LinkOptions", "PeerLink", "fetch_bounds", "nixl_fetch_bounds"]


#: what `asyncio.wait_for` raises: the builtin TimeoutError from 3.11, its own
#: class on 3.10 (where the two differ)
_WaitTimeout = asyncio.TimeoutError  # noqa: UP041


class LinkDown(ConnectionError):
    """The session ended while a request waited on it."""


@dataclass(frozen=True, slots=True)
class LinkOptions:
    keepalive_s: float = 1.0
    timeout_s: float = 5.0
    reconnect_min_s: float = 0.1
    reconnect_max_s: float = 10.0
    lookup_timeout_s: float = 1.0
    #: NIXL: how long a lookup asks the server to hold what it found (0: no leases)
    lease_s: float = 2.0
    #: bytes of the largest fetch of a pipelined load (`PeerLink.fetch`)
    chunk_bytes: int = 16 << 20


_RECV_BATCH = 64  # messages handled per wake-up of the session's loop

CONNECTING, READY, REFUSED, CLOSED = "connecting", "ready", "refused", "closed"


async def _within(future: asyncio.Future[Any], timeout: float) -> Any:
    """`future`'s result, or `_WaitTimeout` after `timeout` s: `asyncio.wait_for`
    for a plain future, without the task 3.11's makes for each wait (a fetch's
    reply is waited for this way dozens of times per load)."""
    def expire() -> None:
        if not future.done():
            future.set_exception(_WaitTimeout())

    timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        return await future
    finally:
        timer.cancel()


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


class PeerLink:
    """The session with the server at `endpoint`. Build, `start` and `close` on
    the loop's thread (or through the loop)."""

    def __init__(self, endpoint: str, hello: Hello, pool: PoolView, *,
                 context: zmq.asyncio.Context, options: LinkOptions = LinkOptions(),
                 curve: CurveKeys | None = None, logger: logging.Logger | None = None,
                 lander: Executor | None = None, nixl: NixlPlane | None = None):
        self.endpoint = endpoint
        self._nixl = nixl
        self._remote: tuple[str, DataPlane] | None = None  # NIXL session: agent, plane
        # Where arriving blocks are copied into their slots and verified: threads,
        # so the loop goes on receiving meanwhile (None: on the loop).
        self._lander = lander
        self._hello = hello
        self._pool = pool
        self._zctx = context
        self._opt = options
        self._curve = curve
        self._log = logger or logging.getLogger("kvtiers.p2p.client")
        # NIXL: the READs of this link's fetches, batched (`NixlReads`)
        self._reads = (NixlReads(nixl, pool, lander, endpoint=endpoint, logger=self._log)
                       if nixl is not None and lander is not None else None)
        self.state = CONNECTING
        #: why the last session ended or was refused ("" while none did)
        self.reason = ""
        self.peer_id = ""
        self.sessions = 0  # sessions that reached ready (tests watch reconnects)
        self.max_fetch = MAX_KEYS  # the server's, from its Welcome
        self.accepts_stores = False  # likewise
        self.capacity_bytes = 0  # likewise: its pool's, when it accepts stores
        self._sock: zmq.asyncio.Socket | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        # NIXL fetches waiting for their reply: their slots and deadline (monotonic)
        self._reading: dict[int, tuple[Sequence[int], float]] = {}
        self._ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.ready_event = asyncio.Event()
        self.plane = ""  # the session's data plane, from the Welcome
        self._in_flight = 0  # blocks of fetches in flight (`_budget`)
        self._room = asyncio.Condition()
        #: this session's leases (NIXL): they hold pin budget too
        self.leases = Leases()

    @property
    def nixl_peer(self) -> tuple[str, DataPlane] | None:
        """NIXL sessions: the server's agent name and descriptor (benches read it)."""
        return self._remote

    @property
    def ready(self) -> bool:
        return self.state == READY

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._supervise())

    async def close(self) -> None:
        """End the session (saying `Disconnect`) and stop reconnecting."""
        self._closing = True
        sock = self._sock
        if sock is not None and self.ready:
            with contextlib.suppress(zmq.ZMQError):
                await sock.send(encode(Disconnect("closing")), zmq.NOBLOCK)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.state = CLOSED

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
            reply: LookupReply = await _within(future, self._opt.lookup_timeout_s)
        except (_WaitTimeout, LinkDown, ProtocolError, zmq.ZMQError):
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
            done, landing = await _within(future, timeout)
        except _WaitTimeout:
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
            done: StoreDone = await _within(future, timeout)
        except _WaitTimeout:
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
        sock = self._sock
        if sock is not None and self.ready and self.accepts_stores and keys:
            with contextlib.suppress(zmq.ZMQError):
                sock.send(encode(Touch(list(keys)[:MAX_KEYS])), zmq.NOBLOCK)

    def _request(self) -> tuple[int, asyncio.Future[Any]]:
        req = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[req] = future
        return req, future

    def _landed(self, req: int) -> None:
        """Tell the server the blocks of `req` are in (it unpins them)."""
        sock = self._sock
        if sock is not None and self.ready:
            with contextlib.suppress(zmq.ZMQError):
                sock.send(encode(Landed(req)), zmq.NOBLOCK)

    def _abort(self, req: int) -> None:
        sock = self._sock
        if sock is not None and self.ready:
            with contextlib.suppress(zmq.ZMQError):
                sock.send(encode(Abort(req)), zmq.NOBLOCK)

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

    # The supervisor.

    async def _supervise(self) -> None:
        wait = self._opt.reconnect_min_s
        while not self._closing:
            was_ready = await self._session()
            if self._closing:
                break
            if was_ready:
                wait = self._opt.reconnect_min_s
            delay = self._opt.reconnect_max_s if self.state == REFUSED else wait
            await asyncio.sleep(delay)
            if not was_ready:
                wait = min(wait * 2, self._opt.reconnect_max_s)

    async def _session(self) -> bool:
        """One session, from connect to its end; True if it reached ready."""
        loop = asyncio.get_running_loop()
        sock = self._zctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        reached = False
        try:
            if self._curve is not None:
                self._curve.apply_client(sock)
            sock.connect(self.endpoint)
            self._sock = sock
            if self.state != REFUSED:  # a refused link says so while it tries again
                self.state = CONNECTING
            await sock.send(encode(self._hello))
            heard = pinged = loop.time()
            seq = itertools.count(1)
            tick = max(1, int(self._opt.keepalive_s * 1000 / 2))
            while not self._closing:
                if await sock.poll(tick):
                    if self._receive_all(sock):
                        break
                    heard = loop.time()
                    reached = reached or self.ready
                now = loop.time()
                if now - heard > self._opt.timeout_s:
                    self.reason = f"silent for more than {self._opt.timeout_s:g} s"
                    if self.ready:
                        self._log.warning("peer %s: %s; reconnecting", self.endpoint,
                                          self.reason)
                    break
                if self.ready and now - pinged >= self._opt.keepalive_s:
                    await sock.send(encode(KeepAlive(next(seq), reply=True)), zmq.NOBLOCK)
                    pinged = now
                if len(self.leases):
                    lapsed = self.leases.expired(time.monotonic())
                    for req in lapsed:
                        self._abort(req)
                    if lapsed:
                        self._room_changed()
        except zmq.ZMQError as exc:
            self.reason = f"socket error: {exc}"
            self._log.warning("peer %s: %s", self.endpoint, self.reason)
        finally:
            self._sock = None
            if self.state != REFUSED:
                self.state = CONNECTING
            self.ready_event.clear()
            if len(self.leases):  # the server drops this session's pins with it
                self.leases.clear()
                self._room_changed()
            pending, self._pending = self._pending, {}
            for future in pending.values():
                if not future.done():
                    future.set_exception(LinkDown(self.reason or "session ended"))
            sock.close(0)
        return reached

    def _receive_all(self, sock: zmq.asyncio.Socket) -> bool:
        """Handle every message waiting (up to a batch: one wake-up of the loop
        per burst of replies, not per reply); True when one ends the session."""
        for _ in range(_RECV_BATCH):
            # NOBLOCK: the socket's future is done at once (a message, or Again)
            future = cast("asyncio.Future[list[zmq.Frame]]",
                          sock.recv_multipart(zmq.NOBLOCK, copy=False))
            if not future.done():
                future.cancel()
                break
            try:
                parts = future.result()
            except zmq.Again:
                break
            if self._dispatch(sock, parts):
                return True
        return False

    def _dispatch(self, sock: zmq.asyncio.Socket, parts: list[zmq.Frame]) -> bool:
        """Handle one message; True when it ends the session."""
        try:
            message = decode_server(parts[0].buffer)
        except ProtocolError as exc:
            self._log.warning("peer %s sent a bad message: %s", self.endpoint, exc)
            return False
        if len(parts) > 1 and not isinstance(message, TransferDone):
            return False  # extra frames only follow a TransferDone
        if isinstance(message, Welcome):
            if self.state in (CONNECTING, REFUSED):
                self.state = READY
                self.peer_id = message.peer_id
                self.max_fetch = message.max_fetch
                self.accepts_stores = message.accepts_stores
                self.capacity_bytes = message.capacity_bytes
                self.plane = message.data_plane.kind
                self._remote = None
                if self.plane == "nixl" and self._nixl is not None:
                    try:
                        agent = self._nixl.connect(message.data_plane)
                    except Exception as exc:  # noqa: BLE001 - NIXL raises its own types
                        self.reason = f"NIXL could not reach the peer's agent: {exc}"
                        self._log.error("peer %s: %s", self.endpoint, self.reason)
                        self.state = REFUSED
                        return True
                    self._remote = (agent, message.data_plane)
                self.sessions += 1
                self.reason = ""
                self.ready_event.set()
                self._log.info("connected to peer %r at %s (data plane %s)",
                               message.peer_id[:100], self.endpoint, message.data_plane.kind)
        elif isinstance(message, Refused):
            self.state = REFUSED
            self.reason = message.reason
            self._log.error("peer %s refused this engine: %s", self.endpoint, message.reason)
            return True
        elif isinstance(message, (LookupReply, TransferDone, StoreDone, ErrorReply)):
            future = self._pending.get(message.req)
            if future is None or future.done():
                return False  # a late reply to a request given up
            if isinstance(message, ErrorReply):
                future.set_exception(ProtocolError(message.reason))
            elif isinstance(message, TransferDone):
                reading = self._reading.get(message.req)
                if reading is not None and self._remote is not None and (
                        self._reads is not None):
                    slots, end = reading
                    future.set_result((message, self._reads.start(
                        self._remote, message, slots, max(end - time.monotonic(), 0.1))))
                else:
                    future.set_result((message, parts[1:]))
            else:
                future.set_result(message)
        elif isinstance(message, KeepAlive):
            if message.reply:
                with contextlib.suppress(zmq.ZMQError):
                    sock.send(encode(KeepAlive(message.seq)), zmq.NOBLOCK)
        elif isinstance(message, Disconnect):
            self.reason = f"peer said goodbye: {message.reason[:200]}"
            self._log.info("peer %s: %s", self.endpoint, self.reason)
            return True
        return False
