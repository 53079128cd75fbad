"""The wire protocol's decoders: whatever bytes arrive, they return a message within
the protocol's limits or raise `ProtocolError` - never another exception.
Hypothesis fuzzes every decoder with random bytes, random msgpack documents under
every tag, messages with fields in and out of range, and mutated encodings."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvtiers.contract.keys import GROUP_BYTES
from kvtiers_p2p.wire.codec import ProtocolError, check_slots, decode_client, decode_server, encode
from kvtiers_p2p.wire.protocol import (
    MAX_CONTROL_BYTES,
    MAX_KEY_BYTES,
    MAX_KEYS,
    MAX_SLOTS,
    PROTOCOL_VERSION,
    Abort,
    DataPlane,
    Disconnect,
    ErrorReply,
    Fetch,
    Hello,
    KeepAlive,
    Lookup,
    LookupReply,
    Refused,
    State,
    Store,
    StoreDone,
    TransferDone,
    Welcome,
)

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

TAGS = ["hello", "welcome", "refused", "lookup", "found", "fetch", "done", "store", "stored",
        "abort", "ping", "bye", "error"]
DECODERS = [decode_client, decode_server]

KEY = b"\x01" * 32 + b"\x00" * GROUP_BYTES
PLANE = DataPlane("zmq", 64, 16384)


def check_within_limits(message: Any) -> None:
    """What a decoded message promises its user."""
    keys = getattr(message, "keys", None)
    if keys is not None:
        assert len(keys) <= MAX_KEYS
        assert all(GROUP_BYTES < len(k) <= MAX_KEY_BYTES for k in keys)
    if isinstance(message, Fetch):
        assert len(message.keys) == len(message.slots)
        assert len(set(message.keys)) == len(message.keys)
        assert len(set(message.slots)) == len(message.slots)
        assert all(0 <= s < MAX_SLOTS for s in message.slots)
    if isinstance(message, (LookupReply, TransferDone)):
        assert all(b <= State.MAX for b in message.states)
    if isinstance(message, TransferDone):
        assert message.states.count(State.PRESENT) == len(message.checksums)
    if isinstance(message, LookupReply) and (message.lease_s or message.source_slots):
        held = message.states.count(State.PRESENT)
        assert message.lease_s and held == len(message.source_slots) == len(message.checksums)
        assert len(set(message.source_slots)) == held
    if isinstance(message, (Hello, Welcome)):
        assert message.data_plane.slot_bytes % 4096 == 0


def decode_or_reject(decoder: Any, data: Any) -> None:
    try:
        message = decoder(data)
    except ProtocolError:
        return
    check_within_limits(message)


# Every message survives a round trip through the decoder of its direction.

CLIENT = [
    Hello(PROTOCOL_VERSION, "a", "ns", "seed", 16384, ["zmq"], PLANE),
    Lookup(1, [KEY]),
    Lookup(1, [KEY], 2.5),  # asking for a lease
    Fetch(2, [KEY, KEY[::-1]], [0, 63]),
    Store(8, [KEY], [12345]),
    Abort(3),
    KeepAlive(4, reply=True),
    Disconnect("bye"),
]
SERVER = [
    Welcome("b", 1.0, PLANE),
    Welcome("b", 1.0, PLANE, 16),
    Refused("namespace mismatch"),
    LookupReply(1, bytes([State.PRESENT, State.ABSENT, State.PENDING])),
    LookupReply(1, bytes([State.PRESENT, State.ABSENT, State.PRESENT]), 2.0, [7, 0],
                [(1 << 64) - 1, 0]),  # a lease
    TransferDone(2, bytes([State.PRESENT, State.REFUSED]), [(1 << 64) - 1]),
    StoreDone(8, bytes([State.PRESENT, State.CORRUPT, State.REFUSED])),
    KeepAlive(4),
    Disconnect(),
    ErrorReply(7, "bad slot"),
]


@pytest.mark.parametrize("message", CLIENT, ids=lambda m: type(m).__name__)
def test_client_messages_round_trip(message: Any) -> None:
    assert decode_client(encode(message)) == message


@pytest.mark.parametrize("message", SERVER, ids=lambda m: type(m).__name__)
def test_server_messages_round_trip(message: Any) -> None:
    assert decode_server(encode(message)) == message


@pytest.mark.parametrize("message", [m for m in SERVER if not isinstance(
    m, (KeepAlive, Disconnect))], ids=lambda m: type(m).__name__)
def test_a_server_does_not_accept_what_only_servers_send(message: Any) -> None:
    with pytest.raises(ProtocolError):
        decode_client(encode(message))


@pytest.mark.parametrize("message", [m for m in CLIENT if not isinstance(
    m, (KeepAlive, Disconnect))], ids=lambda m: type(m).__name__)
def test_a_puller_does_not_accept_what_only_pullers_send(message: Any) -> None:
    with pytest.raises(ProtocolError):
        decode_server(encode(message))


# Specific rejections.

def raw(*fields: Any) -> bytes:
    return msgspec.msgpack.encode(list(fields))


@pytest.mark.parametrize("data, why", [
    (raw("fetch", 1, [KEY] * 2, [1]), "2 keys but 1 slots"),
    (raw("store", 1, [KEY], [1, 2]), "1 keys but 2 checksums"),
    (raw("store", 1, [KEY, KEY], [1, 2]), "more than once"),
    (raw("fetch", 1, [KEY, KEY], [1, 2]), "more than once"),
    (raw("fetch", 1, [KEY, KEY[::-1]], [5, 5]), "one slot"),
    (raw("fetch", 1, [KEY], [-1]), "malformed"),
    (raw("fetch", 1, [KEY], [MAX_SLOTS]), "malformed"),
    (raw("fetch", 1, [KEY], ["3"]), "malformed"),
    (raw("fetch", -1, [KEY], [3]), "malformed"),
    (raw("lookup", 1, [KEY] * (MAX_KEYS + 1)), "malformed"),
    (raw("lookup", 1, [b"\x00" * GROUP_BYTES]), "malformed"),  # no hash
    (raw("lookup", 1, [b"\x00" * (MAX_KEY_BYTES + 1)]), "malformed"),
    (raw("lookup", 1, [KEY], "extra"), "malformed"),
    (raw("lookup", 1), "malformed"),
    (raw("lookup", 1, [KEY], -1.0), "malformed"),  # a lease of negative time
    (raw("lookup", 1, [KEY], 3601.0), "malformed"),
    (raw("teleport", 1, [KEY]), "malformed"),
    (raw(), "malformed"),
    (b"", "malformed"),
    (b"\xc1", "malformed"),
    (msgspec.msgpack.encode({"t": "lookup", "req": 1, "keys": [KEY]}), "malformed"),
    (raw("hello", 1, "a", "ns", "s", 16384, ["zmq"], ["zmq", 64, 1000]), "4096"),
    (raw("hello", 1, "a", "ns", "s", 16384, ["zmq"], ["nixl", 64, 4096]), "agent metadata"),
    (raw("hello", 1, "a", "ns", "s", 16384, ["zmq"], ["rdma", 64, 4096]), "malformed"),
    (raw("hello", 1, "a", "ns", "s", 16384, ["x"] * 17, ["zmq", 64, 4096]), "malformed"),
    (raw("hello", 1, "a" * 257, "ns", "s", 16384, ["zmq"], ["zmq", 64, 4096]), "malformed"),
])
def test_a_server_rejects(data: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        decode_client(data)


@pytest.mark.parametrize("data, why", [
    (raw("done", 1, bytes([State.PRESENT] * 2), [1]), "2 blocks shipped but 1 checksums"),
    (raw("done", 1, bytes([State.MAX + 1]), []), "unknown key state"),
    (raw("found", 1, bytes([9])), "unknown key state"),
    (raw("stored", 1, bytes([State.MAX + 1])), "unknown key state"),
    (raw("found", 1, bytes(MAX_KEYS + 1)), "malformed"),
    (raw("found", 1, b"\x01", 2.0, [1, 2], [3]), "a lease of 2 s with 1 keys present, 2 slots"),
    (raw("found", 1, b"\x01", 0.0, [1], [3]), "a lease of 0 s"),  # slots, no lease
    (raw("found", 1, b"\x00", 2.0, [], []), "with 0 keys present"),  # a lease of nothing
    (raw("found", 1, b"\x01\x01", 2.0, [4, 4], [1, 2]), "two leased keys in one slot"),
    (raw("found", 1, b"\x01", -2.0, [1], [3]), "malformed"),
    (raw("found", 1, b"\x01", 2.0, [MAX_SLOTS], [3]), "malformed"),
    (raw("done", 1, b"\x01", [-5]), "malformed"),
    (raw("welcome", "b", 0.0, ["zmq", 1, 4096]), "malformed"),
    (raw("welcome", "b", 1.0, ["zmq", 1 << 30, 1 << 20]), "256 TiB"),
    (raw("welcome", "b", 1.0, ["zmq", 1, 4096], 0), "malformed"),
    (raw("welcome", "b", 1.0, ["zmq", 1, 4096], MAX_KEYS + 1), "malformed"),
])
def test_a_puller_rejects(data: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        decode_server(data)


def test_an_oversized_frame_is_refused_unread() -> None:
    big = raw("lookup", 1, [b"k" * 100]) + b"\x00" * MAX_CONTROL_BYTES
    for decoder in DECODERS:
        with pytest.raises(ProtocolError, match="control frame of"):
            decoder(big)


def test_non_buffers_are_refused() -> None:
    for decoder in DECODERS:
        with pytest.raises(ProtocolError, match="not a buffer"):
            decoder(12)


def test_slots_past_the_pullers_pool_are_refused() -> None:
    fetch = Fetch(1, [KEY, KEY[::-1]], [3, 64])
    check_slots(Fetch(1, [KEY], [63]), 64)
    with pytest.raises(ProtocolError, match="slot 64 is past the pool's 64 slots"):
        check_slots(fetch, 64)


# Fuzzing.

@FUZZ
@given(st.binary(max_size=2048))
def test_fuzz_random_bytes(data: bytes) -> None:
    for decoder in DECODERS:
        decode_or_reject(decoder, data)


_scalars = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1)
            | st.floats(allow_nan=True) | st.text(max_size=40) | st.binary(max_size=80))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=6)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                       max_leaves=30)


@FUZZ
@given(st.sampled_from(TAGS) | st.text(max_size=8), st.lists(_values, max_size=9))
def test_fuzz_documents_under_every_tag(tag: str, fields: list[Any]) -> None:
    data = raw(tag, *fields)
    for decoder in DECODERS:
        decode_or_reject(decoder, data)


_keys = st.lists(st.binary(min_size=0, max_size=MAX_KEY_BYTES + 4), max_size=12)
_ints = st.integers(-3, 70) | st.integers(MAX_SLOTS - 2, MAX_SLOTS + 2)


@FUZZ
@given(st.integers(-2, 1 << 63), _keys, st.lists(_ints, max_size=12))
def test_fuzz_fetches_in_and_out_of_range(req: int, keys: list[bytes], slots: list[int]) -> None:
    data = raw("fetch", req, keys, slots)
    decode_or_reject(decode_client, data)
    try:
        message = decode_client(data)
    except ProtocolError:
        return
    assert isinstance(message, Fetch)
    try:
        check_slots(message, 64)
    except ProtocolError:
        assert max(message.slots) >= 64
    else:
        assert all(s < 64 for s in message.slots)


@FUZZ
@given(st.binary(max_size=MAX_KEYS + 8), st.lists(st.integers(-1, (1 << 64) - 1), max_size=8))
def test_fuzz_transfer_done(states: bytes, checksums: list[int]) -> None:
    decode_or_reject(decode_server, raw("done", 1, states, checksums))
    decode_or_reject(decode_server, raw("found", 1, states))


@FUZZ
@given(st.binary(max_size=12), st.floats(-1, 4000) | st.integers(-1, 5),
       st.lists(_ints, max_size=12), st.lists(st.integers(-1, (1 << 64) - 1), max_size=12))
def test_fuzz_leases(states: bytes, lease_s: float, slots: list[int], sums: list[int]) -> None:
    """A lookup's reply with a lease: taken only when it is consistent (a slot and a
    checksum per present key, no slot twice, a time within limits)."""
    decode_or_reject(decode_server, raw("found", 7, states, lease_s, slots, sums))
    decode_or_reject(decode_client, raw("lookup", 7, [KEY], lease_s))


@FUZZ
@given(st.sampled_from(CLIENT + SERVER), st.data())
def test_fuzz_mutated_encodings(message: Any, data: st.DataObject) -> None:
    encoded = bytearray(encode(message))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(0, len(encoded) - 1)))
        if op == "flip" and encoded:
            encoded[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del encoded[at:at + data.draw(st.integers(1, 8))]
        else:
            encoded[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    for decoder in DECODERS:
        decode_or_reject(decoder, bytes(encoded))
        decode_or_reject(decoder, memoryview(encoded))
