"""The puller against a hand-driven server (a raw ROUTER socket on a thread): it
verifies every block in its slot before a success, and a broken, lying or silent
server costs misses within the deadline - never wrong bytes, never a hang."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
from kvtiers.sdk.integrity import checksum
from kvtiers_p2p.pull.link import fetch_bounds, nixl_fetch_bounds
from kvtiers_p2p.wire.codec import decode_client, encode
from kvtiers_p2p.wire.protocol import (
    DataPlane,
    ErrorReply,
    Fetch,
    Hello,
    KeepAlive,
    Lookup,
    LookupReply,
    State,
    TransferDone,
    Welcome,
)

from tests.p2p.conftest import MakeEngine
from tests.p2p.engine import Engine, block_data, keys_for

#: what the fake server answers to a Fetch: (fetch, block_bytes) -> frames to send
Answer = Callable[[Fetch, int], list[bytes] | None]


class FakeServer:
    """Accepts any Hello, says every key is present, answers fetches with `answer`."""

    def __init__(self, answer: Answer, block_bytes: int):
        self.answer = answer
        self.block_bytes = block_bytes
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:0")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.fetches = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(20):
                continue
            ident, frame = self.sock.recv_multipart()
            message = decode_client(frame)
            reply: Any = None
            extra: list[bytes] = []
            if isinstance(message, Hello):
                reply = Welcome("fake", 1.0, DataPlane("zmq", 64, message.data_plane.slot_bytes))
            elif isinstance(message, Lookup):
                reply = LookupReply(message.req, bytes([State.PRESENT] * len(message.keys)))
            elif isinstance(message, KeepAlive) and message.reply:
                reply = KeepAlive(message.seq)
            elif isinstance(message, Fetch):
                self.fetches += 1
                frames = self.answer(message, self.block_bytes)
                if frames is None:
                    continue  # silence
                self.sock.send_multipart([ident, *frames])
                continue
            if reply is not None:
                self.sock.send_multipart([ident, encode(reply), *extra])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def fake() -> Iterator[Callable[[Answer], FakeServer]]:
    made: list[FakeServer] = []

    def make(answer: Answer) -> FakeServer:
        server = FakeServer(answer, 16384)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def honest(fetch: Fetch, bb: int) -> list[bytes]:
    blocks = [block_data(k, bb) for k in fetch.keys]
    done = TransferDone(fetch.req, bytes([State.PRESENT] * len(blocks)),
                        [checksum(b) for b in blocks])
    return [encode(done), *blocks]


def lying(fetch: Fetch, bb: int) -> list[bytes]:
    """The right checksums, but one byte of the second block flipped in flight."""
    frames = honest(fetch, bb)
    if len(frames) > 2:
        damaged = bytearray(frames[2])
        damaged[bb // 2] ^= 0x55
        frames[2] = bytes(damaged)
    return frames


def short(fetch: Fetch, bb: int) -> list[bytes]:
    """One block frame too few."""
    return honest(fetch, bb)[:-1]


def truncated(fetch: Fetch, bb: int) -> list[bytes]:
    frames = honest(fetch, bb)
    frames[1] = frames[1][: bb // 2]
    return frames


def refusing(fetch: Fetch, bb: int) -> list[bytes]:
    return [encode(ErrorReply(fetch.req, "no"))]


def silent(fetch: Fetch, bb: int) -> None:
    return None


def pull(engine: Engine, n: int) -> tuple[list[LookupResult], dict[str, Any]]:
    keys = keys_for("c", n)
    assert engine.wait_ready()
    answers = engine.settle(keys, timeout=60)
    return answers, engine.mgr.stats()["tiers"]["p2p"]


def test_an_honest_server_is_verified_and_loaded(fake: Callable[[Answer], FakeServer],
                                                 engines: MakeEngine) -> None:
    server = fake(honest)
    puller = engines({"peers": [server.endpoint]})
    answers, _ = pull(puller, 4)
    assert answers == [LookupResult.HIT] * 4
    puller.check_loaded(keys_for("c", 4))


def test_a_block_damaged_in_flight_is_corrupt_and_never_served(
        fake: Callable[[Answer], FakeServer], engines: MakeEngine) -> None:
    server = fake(lying)
    puller = engines({"peers": [server.endpoint], "hit_ttl_s": 0.01})
    keys = keys_for("c", 4)
    assert puller.wait_ready()
    answers = puller.settle(keys, timeout=60)
    # The damaged copy failed verification; what a retry loaded later (one block per
    # fetch, which this server does not damage) is checked below, byte for byte.
    assert puller.tier.stats().errors.get("corrupt", 0) >= 1
    hits = [k for k, a in zip(keys, answers, strict=True) if a is LookupResult.HIT]
    puller.check_loaded(hits)  # whatever did land is the right bytes


@pytest.mark.parametrize("answer, reason", [
    (short, FailureReason.IO), (truncated, FailureReason.IO), (refusing, FailureReason.IO),
])
def test_a_broken_transfer_fails_its_keys(fake: Callable[[Answer], FakeServer],
                                          engines: MakeEngine, answer: Answer,
                                          reason: FailureReason) -> None:
    server = fake(answer)
    puller = engines({"peers": [server.endpoint]})
    answers, tier = pull(puller, 3)
    assert answers == [LookupResult.MISS] * 3
    assert tier["promotion_failures"] == 3 and tier["timeouts"] == 0
    assert server.fetches >= 1


def test_a_silent_server_costs_misses_at_the_fetch_timeout(
        fake: Callable[[Answer], FakeServer], engines: MakeEngine) -> None:
    server = fake(silent)
    # The server keeps the session alive but never answers the fetch: the tier's
    # own timeout, well before the manager's deadline, fails the job.
    puller = engines({"peers": [server.endpoint], "fetch_timeout_s": 0.5},
                     job_timeout_s=120.0)
    answers, tier = pull(puller, 2)
    assert answers == [LookupResult.MISS] * 2
    assert tier["timeouts"] == 0 and tier["promotion_failures"] == 2
    assert puller.tier.stats().errors, "the tier reported no failure"


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 20000), st.integers(1, 4096))
def test_a_load_is_cut_into_fetches_that_cover_it_once(n: int, chunk: int) -> None:
    """`fetch_bounds`: every block in exactly one fetch, in order; none larger
    than a chunk; the first small (a short first round trip, the whole load
    when it is that small); none smaller than the first but the last."""
    bounds = fetch_bounds(n, chunk)
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    assert bounds[0] == 0 and bounds[-1] == n and all(s > 0 for s in sizes)
    assert all(s <= chunk for s in sizes)
    floor = max(1, chunk // 32)
    if sizes:
        assert sizes[0] == (n if n < 2 * floor else floor)
        assert all(s >= min(floor, n) for s in sizes[:-1])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20000), st.integers(1, 4096), st.integers(1, 5000))
def test_a_nixl_load_is_a_short_first_fetch_then_fetches_of_the_pin_budget(
        n: int, max_fetch: int, first: int) -> None:
    """`nixl_fetch_bounds`: every block in exactly one fetch, in order; none over
    the server's pin budget; the first `first` blocks (at most the budget) alone,
    then every fetch but the last of the whole budget."""
    bounds = nixl_fetch_bounds(n, max_fetch, first)
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    assert bounds[0] == 0 and bounds[-1] == n and all(s > 0 for s in sizes)
    assert all(s <= max_fetch for s in sizes)
    head = min(first, max_fetch)
    assert sizes[0] == min(head, n)
    assert all(s == max_fetch for s in sizes[1:-1])


def test_a_load_of_a_few_chunks_ramps_up_then_shrinks_at_its_end() -> None:
    sizes = [b - a for a, b in itertools.pairwise(fetch_bounds(2048, 512))]
    assert sizes == [16, 32, 64, 128, 256, 512, 512, 264, 132, 132]
