"""`PeerServer`: serves this engine's CPU pool to peers, through `ParentManager`.

One thread of its own owns a ZeroMQ ROUTER socket (ZeroMQ sockets belong to one
thread). Per peer it keeps a session, made by a `Hello` the handshake accepts;
every other message of a peer without one gets `Disconnect("no session")`, so a
puller that this side dropped (or restarted without) says hello again.

- `Lookup`: `parent.lookup` per key: HIT is PRESENT, HIT_PENDING (a write into the
  pool in flight: a promotion this lookup may just have started) is PENDING,
  anything else ABSENT. A lookup that the manager answers RETRY (one of its own
  tiers probing, possibly a p2p tier asking peers in turn) is ABSENT, so two
  engines that ask each other never keep each other waiting.
  With `lease_s` (NIXL sessions), the PRESENT keys are pinned at once, all or
  none, within the peer's pin budget (`create_store_job`), and the reply says
  their slots and checksums: the puller READs them with no `Fetch`. The lease is
  a shipment like a fetch's (below), for `lease_s` (at most `pin_timeout_s`).
- `Fetch`: the slots are checked against the puller's pool; the readable keys are
  pinned with `parent.create_store_job` (all or nothing: re-tried once with a fresh
  lookup when a block went meanwhile), within the peer's pin budget (a share of the
  pool); their bytes go out as zero-copy frames after a `TransferDone` that carries
  each block's checksum. The pins are released (`complete_store_job`) when the
  puller says the blocks landed (`Landed`) or gave up (`Abort`), or after
  `pin_timeout_s` in any case: a block changed under a frame still queued then
  fails its checksum at the puller - a miss, never wrong bytes. Until then, what
  a lookup called a hit stays: a store cannot evict it while the load reads it.
- `Store` (only with a `sink`: a `kvtiers serve` cache node): each pushed block is
  verified against its checksum, then handed to the sink, which keeps it in the
  node's pool (HELD when it was there already) and says what it evicted; without
  a sink every key is REFUSED. `Touch` refreshes recency in such a node's pool.
- A session silent past `session_timeout_s`, or that says `Disconnect`, is dropped
  with its pins. `close` says `Disconnect` to every session and releases all pins.

Nothing here blocks on a peer: sends never wait (a peer whose queue is full loses
the message and times out on its side), and the loop wakes at least every 50 ms.
A malformed message is logged (rate-limited per peer) and answered or dropped; it
never ends the thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq
from kvtiers.errors import KvtiersError
from kvtiers.sdk import BlockKey, LookupResult, ParentManager, PoolView, checksum

from kvtiers_p2p.serve.sessions import ServeLimits, Session, Shipment, StoreSink
from kvtiers_p2p.serve.sums import BlockSums
from kvtiers_p2p.wire.codec import ProtocolError, check_slots, decode_client, encode
from kvtiers_p2p.wire.handshake import Identity, Refusal, choose_plane, refusal
from kvtiers_p2p.wire.nixl_plane import NixlPlane
from kvtiers_p2p.wire.protocol import (
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
from kvtiers_p2p.wire.security import CurveKeys

__all__ = ["ListenError", "PeerServer", "ServeLimits", "StoreSink", "listen_reason"]

_POLL_MS = 50
_BATCH = 256  # messages handled before the housekeeping runs again
_CLOSE_WAIT_S = 2.0  # how long close lets transfers under way and goodbyes finish
DEFAULT_LIMITS = ServeLimits()

#: why a bind failed, in words, by errno (ZeroMQ's and the OS's are the same codes)
_REASONS = {
    errno.EADDRINUSE: "the address is in use (another kvtiers serve, engine or program "
                      "holds it)",
    errno.EADDRNOTAVAIL: "no network interface of this machine has that address",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.ENODEV: "no interface of this machine has that name or address (or the host "
                  "name does not resolve)",
    errno.EINVAL: "not a valid address (host and port 0..65535)",
    errno.EMFILE: "too many open files in this process",
}


def listen_reason(exc: BaseException) -> str:
    """Why binding failed, in words: what the errno means for a listener, else the
    error's own text."""
    code = getattr(exc, "errno", None)
    reason = _REASONS.get(code) if isinstance(code, int) else None
    if reason is not None:
        return reason
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text)


class ListenError(KvtiersError):
    """A `PeerServer` cannot listen on `address` ("tcp://HOST:PORT"): `reason` in
    words, `errno` the error's code (None without one), the cause chained."""

    def __init__(self, address: str, cause: BaseException):
        code = getattr(cause, "errno", None)
        self.address = address
        self.reason = listen_reason(cause)
        self.errno: int | None = code if isinstance(code, int) else None
        super().__init__(f"cannot listen on {address}: {self.reason}")

    def what_to_do(self, port: str, host: str) -> str:
        """What the user changes, `port` and `host` naming the config's fields
        ("the config's secondary_tiers[0].port", ...)."""
        if self.errno == errno.EADDRINUSE:
            return f"pick another port ({port}; 0 picks a free one) or stop what holds it"
        return f"check {host} and {port} (0 picks a free port)"


class PeerServer:
    """Serve `pool` (the manager's) from `parent` on `bind` ("tcp://HOST:PORT";
    port 0 picks one: see `endpoint`). `start` binds (`ListenError` when it
    cannot) and starts the thread; `close` stops it. Both block briefly; neither is for the
    scheduler thread's hot path (they run at start-up and shutdown)."""

    def __init__(self, parent: ParentManager, pool: PoolView, identity: Identity, *,
                 bind: str, limits: ServeLimits = DEFAULT_LIMITS,
                 curve: CurveKeys | None = None, sink: StoreSink | None = None,
                 logger: logging.Logger | None = None, nixl: NixlPlane | None = None):
        self._parent = parent
        self._pool = pool
        self._identity = identity
        self._bind = bind
        self._limits = limits
        self._curve = curve
        self._sink = sink
        self._nixl = nixl  # the NIXL plane: its agent has `pool` registered
        self._sums = BlockSums(parent, pool)  # the checksums shipped with blocks
        self._capacity_bytes = pool.num_slots * pool.block_bytes if sink is not None else 0
        self._log = logger or logging.getLogger("kvtiers.p2p.server")
        self._max_pinned = max(1, int(pool.num_slots * limits.max_pinned_share))
        self._sessions: dict[bytes, Session] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        self._warned: dict[bytes, float] = {}
        self._auth: Any = None
        self.endpoint = ""
        #: counters (read by stats and tests; written by the server thread only)
        self.counters = {"sessions": 0, "refused": 0, "lookups": 0, "fetches": 0,
                         "blocks_shipped": 0, "bytes_shipped": 0, "bad_messages": 0,
                         "dropped_sessions": 0, "pin_timeouts": 0, "over_budget": 0,
                         "blocks_stored": 0, "leases": 0, "blocks_leased": 0}

    # Lifecycle (any thread but the server's).

    def start(self) -> None:
        """Bind and start the thread. `ListenError` when the address cannot be
        bound (in use, not this machine's, not allowed, ...) or a socket cannot be
        made: everything made so far is closed (the context too), so a failed
        server holds no thread, port or descriptor."""
        sock: zmq.Socket[bytes] | None = None
        try:
            sock = self._ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting peer's new session wins
            sock.setsockopt(zmq.MAXMSGSIZE, -1)  # control frames are checked by size when read
            if self._curve is not None:
                self._auth = self._curve.start_authenticator(self._ctx)
                self._curve.apply_server(sock)
            sock.bind(self._bind)
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            thread = threading.Thread(target=self._serve, name="kvtiers-p2p-server",
                                      daemon=True)
            self._sock = sock
            thread.start()
            self._thread = thread
        except BaseException as exc:
            self._sock = None
            self.endpoint = ""
            if sock is not None:
                sock.close(0)
            if self._auth is not None:
                with contextlib.suppress(Exception):
                    self._auth.stop()
                self._auth = None
            with contextlib.suppress(Exception):
                self._ctx.term()
            if isinstance(exc, (zmq.ZMQError, OSError)):
                raise ListenError(self._bind, exc) from exc
            raise
        self._log.info("serving peers on %s as %s", self.endpoint, self._identity.peer_id)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving: every session is told `Disconnect` and its pins released.
        Idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)  # the thread closes its socket and the context
        elif self._sock is None and not self._ctx.closed:
            self._ctx.term()

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    # The server thread.

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        try:
            while not self._stop.is_set():
                if sock.poll(_POLL_MS, zmq.POLLIN):
                    for _ in range(_BATCH):
                        try:
                            parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._receive(sock, parts)
                self._housekeeping(time.monotonic())
        except Exception:  # noqa: BLE001 - logged; the pins are released below
            self._log.exception("p2p server stopped by an error")
        finally:
            # Transfers under way end first (bounded: a peer that does not read
            # does not hold the shutdown), then every peer is told, then pins go.
            end = time.monotonic() + _CLOSE_WAIT_S
            while any(s.shipments for s in self._sessions.values()) and (
                    time.monotonic() < end):
                for session in self._sessions.values():
                    self._settle(session, time.monotonic())
                time.sleep(0.005)
            for ident in list(self._sessions):
                self._send(sock, ident, Disconnect("server closing"))
                self._drop(ident, why=None)
            sock.close(linger=int(_CLOSE_WAIT_S * 1000))  # the goodbyes get out
            if self._auth is not None:
                self._auth.stop()
            self._ctx.term()

    def _receive(self, sock: zmq.Socket[bytes], parts: list[zmq.Frame]) -> None:
        ident = parts[0].bytes
        if len(parts) < 2:
            self._bad(sock, ident, 0, "an empty message")
            return
        try:
            message = decode_client(parts[1].buffer)
        except ProtocolError as exc:
            self._bad(sock, ident, 0, str(exc))
            return
        blocks = parts[2:]
        if blocks and not isinstance(message, Store):
            self._bad(sock, ident, 0, f"a message of {len(parts) - 1} frames (expected 1)")
            return
        now = time.monotonic()
        if isinstance(message, Hello):
            self._hello(sock, ident, message, now)
            return
        session = self._sessions.get(ident)
        if session is None:
            if not isinstance(message, Disconnect):
                # A puller whose session this side dropped (or never had: a restart)
                # learns it must say hello again.
                self._send(sock, ident, Disconnect("no session: send hello first"))
            return
        session.heard = now
        if isinstance(message, Lookup):
            self._lookup(sock, ident, session, message, now)
        elif isinstance(message, Fetch):
            self._fetch(sock, ident, session, message, now)
        elif isinstance(message, Store):
            self._store(sock, ident, message, blocks)
        elif isinstance(message, Touch):
            self._touch(message)
        elif isinstance(message, KeepAlive):
            if message.reply:
                self._send(sock, ident, KeepAlive(message.seq))
        elif isinstance(message, (Landed, Abort)):
            self._release(session, message.req)
        elif isinstance(message, Disconnect):
            self._drop(ident, why=f"said goodbye ({message.reason[:100]})")

    def _hello(self, sock: zmq.Socket[bytes], ident: bytes, hello: Hello, now: float) -> None:
        node = self._sink is not None  # a `kvtiers serve` cache node takes stores
        verdict = refusal(self._identity, hello, endpoint=self.endpoint, node=node)
        if verdict is None and ident not in self._sessions and (
                len(self._sessions) >= self._limits.max_sessions):
            most = f"serves at most {self._limits.max_sessions} peers at once"
            verdict = Refusal(f"this {'node' if node else 'engine'} {most}",
                              f"the {'node' if node else 'peer'} at {self.endpoint} {most}")
        if verdict is not None:
            self.counters["refused"] += 1
            self._log.warning("refused peer %r: %s", hello.peer_id[:100], verdict.for_server)
            self._send(sock, ident, Refused(verdict.for_puller))
            return
        if ident in self._sessions:  # a second hello: a new session replaces the old
            self._drop(ident, why=None)
        kind = choose_plane(self._identity.capabilities, hello.capabilities)
        assert kind is not None  # refusal() checked
        self._sessions[ident] = Session(hello.peer_id, hello.data_plane.num_slots, now,
                                        plane=kind)
        self.counters["sessions"] += 1
        self._log.info("peer %r connected (data plane %s)", hello.peer_id[:100], kind)
        if kind == "nixl" and self._nixl is not None:
            plane = self._nixl.descriptor()
        else:
            plane = DataPlane("zmq", self._pool.num_slots, self._pool.slot_bytes)
        self._send(sock, ident, Welcome(self._identity.peer_id, self._limits.keepalive_s, plane,
                                        min(self._max_pinned, MAX_KEYS),
                                        accepts_stores=self._sink is not None,
                                        capacity_bytes=self._capacity_bytes))

    def _lookup(self, sock: zmq.Socket[bytes], ident: bytes, session: Session,
                lookup: Lookup, now: float) -> None:
        self.counters["lookups"] += 1
        keys = lookup.keys
        leasing = lookup.lease_s > 0 and session.plane == "nixl" and self._nixl is not None
        if leasing:
            self._settle(session, now)  # pins past their timeout go first
            # The common case first: every key held - one call pins them all.
            if self._leased(sock, ident, session, lookup, bytes([State.PRESENT]) * len(keys),
                            keys, now):
                return
        parent_lookup = self._parent.lookup
        found = bytearray(len(keys))
        for i, key in enumerate(keys):
            answer = parent_lookup(key)
            if answer is LookupResult.HIT:
                found[i] = State.PRESENT
            elif answer is LookupResult.HIT_PENDING:
                found[i] = State.PENDING
        states = bytes(found)
        if leasing and self._leased(sock, ident, session, lookup, states, [
                keys[i] for i, state in enumerate(states) if state == State.PRESENT], now):
            return
        self._send(sock, ident, LookupReply(lookup.req, states))

    def _leased(self, sock: zmq.Socket[bytes], ident: bytes, session: Session,
                lookup: Lookup, states: bytes, held: Sequence[BlockKey], now: float) -> bool:
        """Pin `held` (the keys `states` calls PRESENT) for `lookup`'s lease and
        answer with it; False (nothing pinned, nothing sent) when there are none,
        they are past the peer's budget, one is there twice, or one is not readable
        any more."""
        if not held or len(held) > self._max_pinned - session.pinned or (
                len(set(held)) != len(held)):
            return False
        job = self._parent.create_store_job(held)
        if job is None:
            return False
        self._send(sock, ident, self._lease(session, lookup, states, held, job.job_id,
                                            job.slots, now))
        return True

    def _lease(self, session: Session, lookup: Lookup, states: bytes,
               held: Sequence[BlockKey], job_id: int, slots: Sequence[int],
               now: float) -> LookupReply:
        """The reply to `lookup` whose `held` keys were just pinned in `slots`: the
        pins are the peer's until it says `Landed`/`Abort` for the lookup, or for
        `lease_s` at most."""
        lease_s = min(lookup.lease_s, self._limits.pin_timeout_s)
        n = len(slots)
        session.pinned += n
        session.shipments.append(Shipment(job_id, n, lookup.req, now + lease_s))
        self.counters["leases"] += 1
        self.counters["blocks_leased"] += n
        return LookupReply(lookup.req, states, lease_s, list(slots),
                           self._sums.of_many(held, slots))

    def _fetch(self, sock: zmq.Socket[bytes], ident: bytes, session: Session,
               fetch: Fetch, now: float) -> None:
        self.counters["fetches"] += 1
        self._settle(session, now)  # pins past their timeout go first
        try:
            check_slots(fetch, session.num_slots)
        except ProtocolError as exc:
            self._bad(sock, ident, fetch.req, str(exc))
            return
        budget = max(self._max_pinned - session.pinned, 0)
        states = bytearray(len(fetch.keys))
        wanted = list(range(len(fetch.keys)))
        # The common case first: every key held, within the budget - one call
        # pins them all (no lookup per key before it).
        job = (self._parent.create_store_job(fetch.keys)
               if 0 < len(wanted) <= budget else None)
        for _attempt in range(2 if job is None else 0):
            states = bytearray(len(fetch.keys))
            wanted = [i for i, key in enumerate(fetch.keys)
                      if self._parent.lookup(key) is LookupResult.HIT]
            if len(wanted) > budget:
                self.counters["over_budget"] += len(wanted) - budget
                for i in wanted[budget:]:
                    states[i] = State.REFUSED
                wanted = wanted[:budget]
            if not wanted:
                break
            job = self._parent.create_store_job([fetch.keys[i] for i in wanted])
            if job is not None:
                break
        if job is None:
            self._send(sock, ident, TransferDone(fetch.req, bytes(states), []))
            return
        block = self._pool.block
        if len(wanted) == len(fetch.keys):  # every key (the common case)
            keys = fetch.keys
            states = bytearray([State.PRESENT]) * len(keys)
        else:
            keys = [fetch.keys[i] for i in wanted]
            for i in wanted:
                states[i] = State.PRESENT
        sums = self._sums.of_many(keys, job.slots)
        if session.plane == "nixl":  # the puller READs the pinned slots, then Landed
            frames: list[zmq.Frame] = []
            header = encode(TransferDone(fetch.req, bytes(states), sums, list(job.slots)))
        else:
            frames = [zmq.Frame(block(slot)) for slot in job.slots]
            header = encode(TransferDone(fetch.req, bytes(states), sums))
        try:
            sock.send_multipart([ident, header, *frames], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:  # full or gone: the peer times out and retries
            self._log.debug("could not ship to %r: %s", session.peer_id[:100], exc)
        n = len(job.slots)
        session.pinned += n
        session.shipments.append(
            Shipment(job.job_id, n, fetch.req, now + self._limits.pin_timeout_s))
        self.counters["blocks_shipped"] += n
        self.counters["bytes_shipped"] += n * self._pool.block_bytes

    def _store(self, sock: zmq.Socket[bytes], ident: bytes, store: Store,
               blocks: list[zmq.Frame]) -> None:
        n = len(store.keys)
        bb = self._pool.block_bytes
        if len(blocks) != n or any(len(b.buffer) != bb for b in blocks):
            self._bad(sock, ident, store.req,
                      f"store {store.req}: {len(blocks)} frames for {n} blocks of {bb} bytes")
            return
        states = bytearray([State.REFUSED] * n)
        evicted: list[BlockKey] = []
        usage = 0
        if self._sink is not None:
            good = []
            for i, block in enumerate(blocks):
                if checksum(block.buffer) == store.checksums[i]:
                    good.append(i)
                else:
                    states[i] = State.CORRUPT
            if good:
                for i in good:  # before the pool takes them: see BlockSums.remember
                    self._sums.remember(store.keys[i], store.checksums[i])
                answer = self._sink([store.keys[i] for i in good],
                                    [blocks[i].buffer for i in good])
                for i, state in zip(good, answer.states, strict=True):
                    states[i] = state
                    if state != State.PRESENT:  # not these bytes (held: the pool's own)
                        self._sums.forget(store.keys[i])
                self.counters["blocks_stored"] += answer.states.count(State.PRESENT)
                evicted, usage = answer.evicted[:MAX_KEYS], answer.usage_bytes
        self._send(sock, ident, StoreDone(store.req, bytes(states), evicted, usage))

    def _touch(self, touch: Touch) -> None:
        """Refresh recency in the parent's pool, when the parent can (a manager's
        `touch`; a `ParentManager` need not have one)."""
        refresh = getattr(self._parent, "touch", None)
        if self._sink is not None and callable(refresh):
            refresh(touch.keys)

    # Housekeeping: pins whose frames ZeroMQ released, sessions gone silent.

    def _housekeeping(self, now: float) -> None:
        if self._nixl is not None:
            self._nixl.progress()  # a NIXL target: connection set-up needs it (50 ms)
        timeout = self._limits.session_timeout_s
        for ident, session in list(self._sessions.items()):
            if now - session.heard > timeout:
                self._drop(ident, why=f"silent for more than {timeout:g} s")
                continue
            if session.shipments:
                self._settle(session, now)

    def _release(self, session: Session, req: int) -> None:
        """The peer is done with fetch `req`'s blocks (landed, or gave up)."""
        for k, shipment in enumerate(session.shipments):
            if shipment.req == req:
                self._unpin(session, session.shipments.pop(k))
                return

    def _settle(self, session: Session, now: float) -> None:
        kept = []
        for shipment in session.shipments:
            if now > shipment.until:
                self.counters["pin_timeouts"] += 1
                self._unpin(session, shipment)
            else:
                kept.append(shipment)
        session.shipments = kept

    def _unpin(self, session: Session, shipment: Shipment) -> None:
        self._parent.complete_store_job(shipment.job_id)
        session.pinned -= shipment.blocks

    def _drop(self, ident: bytes, why: str | None) -> None:
        session = self._sessions.pop(ident, None)
        if session is None:
            return
        for shipment in session.shipments:
            self._unpin(session, shipment)
        session.shipments = []
        if why is not None:
            self.counters["dropped_sessions"] += 1
            self._log.info("peer %r dropped: %s", session.peer_id[:100], why)

    def _bad(self, sock: zmq.Socket[bytes], ident: bytes, req: int, reason: str) -> None:
        self.counters["bad_messages"] += 1
        now = time.monotonic()
        if now - self._warned.get(ident, -1e9) > 10.0:  # one line per peer per 10 s
            if len(self._warned) > 4096:
                self._warned.clear()
            self._warned[ident] = now
            self._log.warning("rejected a message from peer %s: %s", ident.hex()[:16], reason)
        self._send(sock, ident, ErrorReply(req, reason[:2000]))

    def _send(self, sock: zmq.Socket[bytes], ident: bytes, message: msgspec.Struct) -> None:
        # A peer gone or not reading loses the message and times out on its side.
        with contextlib.suppress(zmq.ZMQError):
            sock.send_multipart([ident, encode(message)], zmq.NOBLOCK)
