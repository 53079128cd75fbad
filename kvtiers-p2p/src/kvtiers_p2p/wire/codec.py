"""Encoding and checked decoding of protocol messages.

Every byte a peer sends is untrusted. `decode_client` (what a server receives) and
`decode_server` (what a puller receives) either return a message that is within
the protocol's limits and consistent with itself, or raise `ProtocolError` - never
another exception, whatever the input: an oversized frame is refused before it is
parsed, an unknown type, a missing or extra field, a wrong type, a value out of
range or a message inconsistent with itself (a Fetch with more keys than slots,
two keys into one slot) is refused after. The caller answers with an `ErrorReply`
or drops the message; the session goes on.

What depends on the session - a slot past the puller's pool, a TransferDone for a
request never made - is checked where the session is known (`check_slots`, the
puller's pending requests).

Thread-safety: the module's encoder and decoders are shared, and msgspec's are safe
to use from several threads at once.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from kvtiers_p2p.wire.protocol import (
    MAX_CONTROL_BYTES,
    ClientMessage,
    DataPlane,
    Fetch,
    Hello,
    LookupReply,
    ServerMessage,
    State,
    Store,
    StoreDone,
    TransferDone,
    Welcome,
)

__all__ = ["ProtocolError", "check_slots", "decode_client", "decode_server", "encode"]

_T = TypeVar("_T")

_encoder = msgspec.msgpack.Encoder()
_client = msgspec.msgpack.Decoder(ClientMessage)
_server = msgspec.msgpack.Decoder(ServerMessage)

#: a pool a peer describes may be at most this large (256 TiB)
MAX_POOL_BYTES = 1 << 48


class ProtocolError(ValueError):
    """A message that breaks the protocol, and why (safe to log and to send back:
    it quotes no more than a short prefix of what was received)."""


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_client(frame: Any) -> ClientMessage:
    """A message a server received (any buffer: bytes, memoryview, a zmq Frame's
    buffer). `ProtocolError` unless it is one of `ClientMessage`, within limits."""
    message: ClientMessage = _decode(_client, frame)
    if isinstance(message, Fetch):
        _check_fetch(message)
    elif isinstance(message, Store):
        if len(message.keys) != len(message.checksums):
            raise ProtocolError(f"store {message.req}: {len(message.keys)} keys but "
                                f"{len(message.checksums)} checksums")
        if len(set(message.keys)) != len(message.keys):
            raise ProtocolError(f"store {message.req}: a key appears more than once")
    elif isinstance(message, Hello):
        _check_plane(message.data_plane)
    return message


def decode_server(frame: Any) -> ServerMessage:
    """A message a puller received; `ProtocolError` unless it is one of
    `ServerMessage`, within limits."""
    message: ServerMessage = _decode(_server, frame)
    if isinstance(message, LookupReply):
        _check_states(message.states)
        _check_lease(message)
    elif isinstance(message, StoreDone):
        _check_states(message.states)
    elif isinstance(message, TransferDone):
        _check_states(message.states)
        shipped = message.states.count(State.PRESENT)
        if shipped != len(message.checksums):
            raise ProtocolError(
                f"done: {shipped} blocks shipped but {len(message.checksums)} checksums")
        if message.source_slots and len(message.source_slots) != shipped:
            raise ProtocolError(f"done: {shipped} blocks shipped but "
                                f"{len(message.source_slots)} source slots")
    elif isinstance(message, Welcome):
        _check_plane(message.data_plane)
    return message


def check_slots(fetch: Fetch, num_slots: int) -> None:
    """`ProtocolError` when a slot of `fetch` is past a pool of `num_slots` slots
    (the puller's, as its Hello described it)."""
    if fetch.slots and (top := max(fetch.slots)) >= num_slots:
        raise ProtocolError(
            f"fetch {fetch.req}: slot {top} is past the pool's {num_slots} slots")


def _decode(decoder: msgspec.msgpack.Decoder[_T], frame: Any) -> _T:
    try:
        view = memoryview(frame)
    except TypeError as exc:
        raise ProtocolError(f"not a buffer: {type(frame).__name__}") from exc
    if view.nbytes > MAX_CONTROL_BYTES:
        raise ProtocolError(
            f"a control frame of {view.nbytes} bytes (at most {MAX_CONTROL_BYTES})")
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    try:
        return decoder.decode(view)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed message: {str(exc)[:200]}") from exc
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # belt and braces
        raise ProtocolError(f"malformed message: {type(exc).__name__}") from exc


def _check_fetch(fetch: Fetch) -> None:
    if len(fetch.keys) != len(fetch.slots):
        raise ProtocolError(
            f"fetch {fetch.req}: {len(fetch.keys)} keys but {len(fetch.slots)} slots")
    if len(set(fetch.keys)) != len(fetch.keys):
        raise ProtocolError(f"fetch {fetch.req}: a key appears more than once")
    if len(set(fetch.slots)) != len(fetch.slots):
        raise ProtocolError(f"fetch {fetch.req}: two keys for one slot")


def _check_states(states: bytes) -> None:
    if states and max(states) > State.MAX:
        raise ProtocolError(f"unknown key state {max(states)}")


def _check_lease(reply: LookupReply) -> None:
    if not (reply.lease_s or reply.source_slots or reply.checksums):
        return
    held = reply.states.count(State.PRESENT)
    if not reply.lease_s or not held or len(reply.source_slots) != held or len(
            reply.checksums) != held:
        raise ProtocolError(
            f"found {reply.req}: a lease of {reply.lease_s:g} s with {held} keys present, "
            f"{len(reply.source_slots)} slots and {len(reply.checksums)} checksums")
    if len(set(reply.source_slots)) != held:
        raise ProtocolError(f"found {reply.req}: two leased keys in one slot")


def _check_plane(plane: DataPlane) -> None:
    if plane.slot_bytes % 4096:
        raise ProtocolError(f"data plane: slot_bytes {plane.slot_bytes} is not a multiple "
                            "of 4096")
    if plane.num_slots * plane.slot_bytes > MAX_POOL_BYTES:
        raise ProtocolError("data plane: a pool larger than 256 TiB")
    if plane.kind == "nixl" and not plane.agent_metadata:
        raise ProtocolError("data plane: nixl without agent metadata")
