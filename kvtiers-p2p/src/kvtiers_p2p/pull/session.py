"""`PeerSession`: a puller's session with one peer's server, kept up on an asyncio
loop - the supervisor under `PeerLink`'s requests (`kvtiers_p2p.pull.link`).

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

A request is a future keyed by its `req` (`_request`), set by its reply as the
supervisor reads it; a reply for a request given up is dropped. What the
requests keep beside the session hooks in: `_transferred` (a `TransferDone` as it
is read), `_tick` (each turn of the supervisor), `_ended` (the session ended).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass
from typing import Any, cast

import zmq
import zmq.asyncio

from kvtiers_p2p.wire.codec import ProtocolError, decode_server, encode
from kvtiers_p2p.wire.nixl_plane import NixlPlane
from kvtiers_p2p.wire.protocol import (
    MAX_KEYS,
    DataPlane,
    Disconnect,
    ErrorReply,
    Hello,
    KeepAlive,
    LookupReply,
    Refused,
    StoreDone,
    TransferDone,
    Welcome,
)
from kvtiers_p2p.wire.security import CurveKeys

__all__ = ["LinkDown", "LinkOptions", "PeerSession", "WaitTimeout", "within"]


#: what `asyncio.wait_for` raises: the builtin TimeoutError from 3.11, its own
#: class on 3.10 (where the two differ)
WaitTimeout = asyncio.TimeoutError


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


async def within(future: asyncio.Future[Any], timeout: float) -> Any:
    """`future`'s result, or `WaitTimeout` after `timeout` s: `asyncio.wait_for`
    for a plain future, without the task 3.11's makes for each wait (a fetch's
    reply is waited for this way dozens of times per load)."""
    def expire() -> None:
        if not future.done():
            future.set_exception(WaitTimeout())

    timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        return await future
    finally:
        timer.cancel()


class PeerSession:
    """The session with the server at `endpoint`. Build, `start` and `close` on
    the loop's thread (or through the loop)."""

    def __init__(self, endpoint: str, hello: Hello, *, context: zmq.asyncio.Context,
                 options: LinkOptions = LinkOptions(), curve: CurveKeys | None = None,
                 logger: logging.Logger | None = None, nixl: NixlPlane | None = None):
        self.endpoint = endpoint
        self._nixl = nixl
        self._remote: tuple[str, DataPlane] | None = None  # NIXL session: agent, plane
        self._hello = hello
        self._zctx = context
        self._opt = options
        self._curve = curve
        self._log = logger or logging.getLogger("kvtiers.p2p.client")
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
        self._ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.ready_event = asyncio.Event()
        self.plane = ""  # the session's data plane, from the Welcome

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

    def _request(self) -> tuple[int, asyncio.Future[Any]]:
        """A new request's `req` and the future its reply sets (the caller pops it
        from `_pending` when it stops waiting)."""
        req = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[req] = future
        return req, future

    def _post(self, message: Any) -> None:
        """Send a message that has no reply; dropped while the session is not ready."""
        sock = self._sock
        if sock is not None and self.ready:
            with contextlib.suppress(zmq.ZMQError):
                sock.send(encode(message), zmq.NOBLOCK)

    # Hooks for what the requests keep beside the session.

    def _transferred(self, done: TransferDone, frames: list[zmq.Frame]) -> Any:
        """What a live fetch's future is set to as its `TransferDone` is read:
        the message and the block frames that followed it."""
        return done, frames

    def _tick(self) -> None:
        """Each turn of the supervisor's loop (at least every `keepalive_s` / 2)."""

    def _ended(self) -> None:
        """The session ended (the server dropped what it held for it); called
        before the requests waiting on it fail."""

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
                self._tick()
        except zmq.ZMQError as exc:
            self.reason = f"socket error: {exc}"
            self._log.warning("peer %s: %s", self.endpoint, self.reason)
        finally:
            self._sock = None
            if self.state != REFUSED:
                self.state = CONNECTING
            self.ready_event.clear()
            self._ended()
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
            self._log.error("the peer at %s refused this engine: %s", self.endpoint,
                            message.reason)
            return True
        elif isinstance(message, (LookupReply, TransferDone, StoreDone, ErrorReply)):
            future = self._pending.get(message.req)
            if future is None or future.done():
                return False  # a late reply to a request given up
            if isinstance(message, ErrorReply):
                future.set_exception(ProtocolError(message.reason))
            elif isinstance(message, TransferDone):
                future.set_result(self._transferred(message, parts[1:]))
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
