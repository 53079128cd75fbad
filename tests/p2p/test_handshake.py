"""The handshake: peers that would exchange keys meaning other bytes are refused,
with a reason both sides log; the refused side gets nothing (misses)."""

from __future__ import annotations

import time

import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers_p2p.wire.handshake import Identity, choose_plane, refusal, seed_fingerprint
from kvtiers_p2p.wire.protocol import PROTOCOL_VERSION, DataPlane, Hello

from tests.p2p.conftest import MakeEngine, Peer, StartPeer
from tests.p2p.engine import keys_for

OURS = Identity("server", "ns-1", seed_fingerprint("0"), 16384, ("zmq",))
PLANE = DataPlane("zmq", 64, 16384)


def hello(**change: object) -> Hello:
    fields: dict[str, object] = dict(
        version=PROTOCOL_VERSION, peer_id="puller", namespace="ns-1",
        hash_seed=seed_fingerprint("0"), block_bytes=16384, capabilities=["zmq"],
        data_plane=PLANE)
    fields.update(change)
    return Hello(**fields)  # type: ignore[arg-type]


def test_a_matching_peer_is_accepted() -> None:
    assert refusal(OURS, hello()) is None


@pytest.mark.parametrize("change, words", [
    ({"version": PROTOCOL_VERSION + 1}, ["protocol version", str(PROTOCOL_VERSION + 1)]),
    ({"namespace": "ns-2"}, ["namespace mismatch", "ns-2", "ns-1"]),
    ({"hash_seed": seed_fingerprint("42")}, ["hash seed mismatch", seed_fingerprint("42")]),
    ({"block_bytes": 8192}, ["block size mismatch", "8192", "16384"]),
    ({"capabilities": ["nixl"]}, ["no common data plane", "nixl"]),
    ({"data_plane": DataPlane("zmq", 64, 4096)}, ["slots of 4096"]),
])
def test_a_mismatch_is_refused_naming_both_sides(change: dict[str, object],
                                                 words: list[str]) -> None:
    reason = refusal(OURS, hello(**change))
    assert reason is not None
    for word in words:
        assert word in reason


def test_the_seed_itself_never_travels() -> None:
    secret = "my-secret-seed-1234"
    fingerprint = seed_fingerprint(secret)
    assert secret not in fingerprint and len(fingerprint) == 16
    reason = refusal(OURS, hello(hash_seed=fingerprint))
    assert reason is not None and secret not in reason


def test_the_pullers_preferred_plane_is_chosen() -> None:
    assert choose_plane(("zmq", "nixl"), ["nixl", "zmq"]) == "nixl"
    assert choose_plane(("zmq",), ["nixl", "zmq"]) == "zmq"
    assert choose_plane(("zmq",), ["nixl"]) is None


def wait_refused(engine_links: object, timeout: float = 20.0) -> str:
    links = list(engine_links.values())  # type: ignore[attr-defined]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if links[0].state == "refused":
            return str(links[0].reason)
        time.sleep(0.01)
    raise AssertionError(f"not refused: {links[0].state}")


def wait_log(peer: Peer, text: str, timeout: float = 20.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        log = peer.log()
        if text in log:
            return log
        time.sleep(0.02)
    raise AssertionError(f"{text!r} not in the server's log: {peer.log()[-2000:]}")


@pytest.mark.parametrize("theirs, ours, words", [
    ({"model": "other-model"}, {}, ["namespace mismatch"]),
    ({"tier": {"port": 0, "hash_seed": "7"}}, {}, ["hash seed mismatch"]),
    ({"block_bytes": 8192}, {}, ["namespace mismatch"]),  # the geometry is in the namespace
], ids=["namespace", "seed", "geometry"])
def test_a_mismatched_peer_process_gets_nothing_and_both_sides_log_why(
        peers: StartPeer, engines: MakeEngine, theirs: dict[str, object],
        ours: dict[str, object], words: list[str],
        caplog: pytest.LogCaptureFixture) -> None:
    server = peers({"seed": "a", "n": 4, **theirs})
    puller = engines({"peers": [server.endpoint], **ours})
    reason = wait_refused(puller.tier.links)
    for word in words:
        assert word in reason
        wait_log(server, word)
    assert any(word in r.getMessage() and "refused" in r.getMessage()
               for r in caplog.records for word in words), "the puller did not log it"
    keys = keys_for("a", 4)
    assert puller.settle(keys) == [LookupResult.MISS] * 4


def test_a_refused_link_says_refused_while_it_tries_again(engines: MakeEngine) -> None:
    """A link retries a server that refused it (at the slowest pace), and says
    "refused" all along - not "connecting" during each retry's handshake, which
    a look at the link (a test, an operator's tool) would catch at random."""
    server = engines({"port": 0}, model="another-model")
    puller = engines({"peers": [server.endpoint]})
    link = next(iter(puller.tier.links.values()))
    wait_refused(puller.tier.links)
    assert server.tier.server is not None
    counters = server.tier.server.counters
    first = counters["refused"]
    seen = set()
    end = time.monotonic() + 10.0
    while counters["refused"] < first + 3 and time.monotonic() < end:  # three retries
        seen.add(link.state)
    assert counters["refused"] >= first + 3, "the link stopped trying"
    assert seen == {"refused"}, seen
    assert "namespace mismatch" in link.reason
