"""A real server under hostile and broken peers, spoken to through a raw DEALER
socket: every bad message gets an error reply or is dropped, nothing outside the
puller's pool is named, pins stay within budget and are released, and the server
goes on serving good peers."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvtiers.sdk.integrity import checksum
from kvtiers_p2p.wire.codec import decode_server, encode
from kvtiers_p2p.wire.protocol import (
    Abort,
    DataPlane,
    Disconnect,
    ErrorReply,
    Fetch,
    KeepAlive,
    Landed,
    Lookup,
    LookupReply,
    State,
    Store,
    StoreDone,
    TransferDone,
    Welcome,
)

from tests.p2p.conftest import MakeEngine
from tests.p2p.engine import Engine, block_data, keys_for


class RawPeer:
    """A hand-driven puller: sends what the test says, reads what comes back."""

    def __init__(self, endpoint: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self, timeout: float = 10.0) -> tuple[Any, list[bytes]]:
        assert self.sock.poll(int(timeout * 1000)), "no answer from the server"
        parts = self.sock.recv_multipart()
        return decode_server(parts[0]), parts[1:]

    def hello(self, engine: Engine, num_slots: int = 64) -> Welcome:
        plane = DataPlane("zmq", num_slots, engine.pool.slot_bytes)
        # Frames on the control socket, whatever planes the engine has (NIXL too).
        identity = dataclasses.replace(engine.tier.identity, capabilities=("zmq",))
        self.send(encode(identity.hello(plane)))
        welcome, _ = self.recv()
        assert isinstance(welcome, Welcome), welcome
        return welcome

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def server(engines: MakeEngine) -> Engine:
    engine = engines({"port": 0, "limits": {"max_pinned_share": 0.125}})  # 8 of 64
    engine.store(keys_for("a", 16))
    return engine


@pytest.fixture
def raw(server: Engine) -> Iterator[RawPeer]:
    peer = RawPeer(server.endpoint)
    yield peer
    peer.close()


def served_well(server: Engine) -> None:
    """A fresh, well-behaved peer is served correctly."""
    peer = RawPeer(server.endpoint)
    try:
        peer.hello(server)
        keys = keys_for("a", 2)
        peer.send(encode(Lookup(5, keys)))
        reply, _ = peer.recv()
        assert reply == LookupReply(5, bytes([State.PRESENT] * 2))
    finally:
        peer.close()


def pinned(server: Engine) -> int:
    return int(server.mgr.stats()["pool"]["pinned"])


def wait_unpinned(server: Engine, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while pinned(server) and time.monotonic() < end:
        time.sleep(0.01)
    assert pinned(server) == 0


def test_a_message_before_hello_ends_nothing_but_gets_told_to_say_hello(
        server: Engine, raw: RawPeer) -> None:
    raw.send(encode(Lookup(1, keys_for("a", 1))))
    reply, _ = raw.recv()
    assert isinstance(reply, Disconnect) and "hello" in reply.reason
    served_well(server)


@pytest.mark.parametrize("frames", [
    [b"garbage"],
    [b""],
    [msgspec.msgpack.encode(["fetch", 1, [b"k" * 36], [1, 2]])],
    [msgspec.msgpack.encode(["welcome", "x", 1.0, ["zmq", 1, 4096]])],  # server-only type
    [encode(Lookup(1, keys_for("a", 1))), b"extra frame"],
    [b"\x00" * (2 << 20)],  # oversized
])
def test_malformed_messages_get_an_error_reply(server: Engine, raw: RawPeer,
                                               frames: list[bytes]) -> None:
    raw.hello(server)
    raw.send(*frames)
    reply, _ = raw.recv()
    assert isinstance(reply, ErrorReply), reply
    served_well(server)
    assert server.tier.server is not None and server.tier.server.counters["bad_messages"] >= 1


def test_a_slot_past_the_pullers_pool_is_refused_and_nothing_is_pinned(
        server: Engine, raw: RawPeer) -> None:
    raw.hello(server, num_slots=8)
    keys = keys_for("a", 2)
    raw.send(encode(Fetch(3, keys, [0, 8])))
    reply, frames = raw.recv()
    assert isinstance(reply, ErrorReply) and reply.req == 3 and "slot 8" in reply.reason
    assert frames == [] and pinned(server) == 0


def test_blocks_ship_with_their_checksums_and_their_pins_are_released(
        server: Engine, raw: RawPeer) -> None:
    raw.hello(server)
    keys = keys_for("a", 4) + keys_for("zzz", 1)
    raw.send(encode(Fetch(4, keys, [0, 1, 2, 3, 4])))
    reply, frames = raw.recv()
    assert isinstance(reply, TransferDone)
    assert reply.states == bytes([State.PRESENT] * 4 + [State.ABSENT])
    for key, frame, sum_ in zip(keys[:4], frames, reply.checksums, strict=True):
        assert frame == block_data(key, server.pool.block_bytes)
        assert checksum(frame) == sum_
    time.sleep(0.2)
    assert pinned(server) == 4, "the pins went before the peer said the blocks landed"
    raw.send(encode(Landed(4)))
    wait_unpinned(server, timeout=2.0)  # well before a silent session's drop


def test_a_peer_cannot_pin_more_than_its_share(server: Engine, raw: RawPeer) -> None:
    assert raw.hello(server).max_fetch == 8  # told at the handshake
    keys = keys_for("a", 12)
    raw.send(encode(Fetch(6, keys, list(range(12)))))
    reply, frames = raw.recv()
    assert isinstance(reply, TransferDone)
    assert reply.states == bytes([State.PRESENT] * 8 + [State.REFUSED] * 4)
    assert len(frames) == 8
    raw.send(encode(Abort(6)))  # giving up releases them too
    wait_unpinned(server, timeout=2.0)


def test_an_engine_takes_no_pushed_blocks(server: Engine, raw: RawPeer) -> None:
    welcome = raw.hello(server)
    assert welcome.accepts_stores is False
    keys = keys_for("pushed", 2)
    blocks = [block_data(k, server.pool.block_bytes) for k in keys]
    raw.send(encode(Store(11, keys, [checksum(b) for b in blocks])), *blocks)
    reply, _ = raw.recv()
    assert reply == StoreDone(11, bytes([State.REFUSED] * 2))
    raw.send(encode(Store(12, keys, [1, 2])), blocks[0])  # a frame short
    reply, _ = raw.recv()
    assert isinstance(reply, ErrorReply) and reply.req == 12
    assert server.mgr.slot_of(keys[0]) is None


def test_a_silent_peer_is_dropped(server: Engine, raw: RawPeer) -> None:
    raw.hello(server)
    srv = server.tier.server
    assert srv is not None
    end = time.monotonic() + 20
    while srv.sessions and time.monotonic() < end:
        time.sleep(0.05)
    assert srv.sessions == 0 and srv.counters["dropped_sessions"] == 1
    raw.send(encode(Lookup(9, keys_for("a", 1))))
    reply, _ = raw.recv()
    assert isinstance(reply, Disconnect)


def test_a_peer_that_keeps_alive_is_kept(server: Engine, raw: RawPeer) -> None:
    raw.hello(server)
    srv = server.tier.server
    assert srv is not None
    for seq in range(12):  # 2.4 s, past the 1.5 s timeout
        raw.send(encode(KeepAlive(seq, reply=True)))
        reply, _ = raw.recv()
        assert reply == KeepAlive(seq)
        time.sleep(0.2)
    assert srv.sessions == 1 and srv.counters["dropped_sessions"] == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=3))
def test_fuzz_the_server_with_random_frames(server: Engine, raw: RawPeer,
                                            frames: list[bytes]) -> None:
    raw.send(*frames)
    raw.send(encode(KeepAlive(1, reply=True)))  # a fence: answered after the fuzz
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        reply, _ = raw.recv()
        if isinstance(reply, (KeepAlive, Disconnect)):
            break
    assert pinned(server) == 0
    served_well(server)
