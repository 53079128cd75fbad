"""Two engines in two processes: one stores blocks into its pool and serves them,
the other finds them through its p2p tier and loads them; bytes verified."""

from __future__ import annotations

from kvtiers.contract.lookup import LookupResult

from tests.p2p.conftest import MakeEngine, StartPeer
from tests.p2p.engine import keys_for, wait_for

HIT, MISS = LookupResult.HIT, LookupResult.MISS


def test_blocks_stored_by_one_engine_are_loaded_by_another(
    peers: StartPeer, engines: MakeEngine
) -> None:
    server = peers({"seed": "a", "n": 24})
    puller = engines({"peers": [server.endpoint]})
    assert puller.wait_ready()
    keys = keys_for("a", 24)
    assert puller.settle(keys) == [HIT] * 24
    puller.check_loaded(keys)
    stats = puller.mgr.stats()["tiers"]["p2p"]
    assert stats["promoted_hits"] == 24
    assert stats["blocks_read"] == 24


def test_keys_the_peer_does_not_hold_are_misses(
    peers: StartPeer, engines: MakeEngine
) -> None:
    server = peers({"seed": "a", "n": 4})
    puller = engines({"peers": [server.endpoint]})
    assert puller.wait_ready()
    held, other = keys_for("a", 4), keys_for("b", 4)
    assert puller.settle(other) == [MISS] * 4
    assert puller.settle(held + other) == [HIT] * 4 + [MISS] * 4
    puller.check_loaded(held)


def test_large_blocks_and_many_of_them(
    peers: StartPeer, engines: MakeEngine
) -> None:
    bb = 2 << 20
    server = peers({"seed": "big", "n": 16, "block_bytes": bb, "slots": 16})
    puller = engines({"peers": [server.endpoint]}, block_bytes=bb, slots=16)
    assert puller.wait_ready()
    keys = keys_for("big", 16)
    assert puller.settle(keys) == [HIT] * 16
    puller.check_loaded(keys)


def test_a_peer_killed_mid_transfer_costs_misses_then_it_comes_back(
    peers: StartPeer, engines: MakeEngine
) -> None:
    server = peers({"seed": "a", "n": 8, "stall": True})
    port = int(server.endpoint.rsplit(":", 1)[1])
    # The manager's own deadline is far: the tier must fail the job itself.
    puller = engines({"peers": [server.endpoint]}, job_timeout_s=120.0)
    assert puller.wait_ready()
    keys = keys_for("a", 8)
    puller.mgr.step()
    assert puller.mgr.lookup(keys[0]) is LookupResult.RETRY  # probing
    answers: list[LookupResult] = []
    while not answers or answers[0] is LookupResult.RETRY:
        puller.mgr.step()
        answers = [puller.mgr.lookup(keys[0])]
    assert answers == [LookupResult.HIT_PENDING]  # a promotion is queued
    puller.mgr.step()  # submits it: the tier sends its fetch
    assert server.readline() == "FETCH"  # the server is mid-transfer: kill it
    server.kill()  # kill -9
    assert puller.settle(keys[:1], timeout=60) == [MISS]
    tier = puller.mgr.stats()["tiers"]["p2p"]
    assert tier["timeouts"] == 0, "the manager's deadline fired: the tier stalled"
    assert tier["promotion_failures"] == 1
    # It comes back on the same port: the link reconnects and pulls again.
    again = peers({"seed": "a", "n": 8, "tier": {"port": port}})
    assert again.endpoint.endswith(f":{port}")
    assert puller.wait_ready(timeout=30)
    assert puller.settle(keys, timeout=30) == [HIT] * 8
    puller.check_loaded(keys)


def test_a_request_naming_its_source_adds_that_peer(
    peers: StartPeer, engines: MakeEngine
) -> None:
    server = peers({"seed": "r", "n": 4})
    host, port = server.endpoint.removeprefix("tcp://").rsplit(":", 1)
    puller = engines({})  # no peers configured
    keys = keys_for("r", 4)
    assert puller.settle(keys) == [MISS] * 4
    params = {"remote_kv_source": {"remote_host": host, "remote_port": int(port),
                                   "kv_request_id": "req-1"}}
    puller.mgr.on_request_start("req-1", params)
    assert list(puller.tier.links) == [server.endpoint]
    assert puller.wait_ready()
    assert puller.settle(keys) == [HIT] * 4
    puller.check_loaded(keys)
    puller.mgr.on_request_start("req-2", {"remote_kv_source": {"remote_host": "a b",
                                                               "remote_port": "x"}})
    assert list(puller.tier.links) == [server.endpoint]  # nonsense is ignored


def test_a_clean_stop_tells_the_puller_at_once(peers: StartPeer, engines: MakeEngine) -> None:
    server = peers({"seed": "s", "n": 2})
    puller = engines({"peers": [server.endpoint], "keepalive": {"interval_s": 1.0,
                                                               "timeout_s": 600.0}})
    assert puller.wait_ready()
    server.stop()
    [link] = puller.tier.links.values()
    assert wait_for(lambda: "goodbye" in link.reason), link.reason  # not the 600 s timeout



def test_a_decode_engine_takes_the_prefill_nodes_blocks_as_hits(
    peers: StartPeer, engines: MakeEngine
) -> None:
    prefill = peers({"seed": "pd", "n": 4})
    decode = engines({"peers": [prefill.endpoint], "role": "remote_prefiller"})
    assert decode.wait_ready()
    keys, absent = keys_for("pd", 4), keys_for("nope", 2)
    # No probe: the first lookup already found it (a promotion is on its way).
    assert [decode.mgr.lookup(k) for k in keys] == [LookupResult.HIT_PENDING] * 4
    assert decode.settle(keys) == [HIT] * 4
    decode.check_loaded(keys)
    assert decode.settle(absent) == [MISS] * 2  # fetched, not there: a miss
    assert decode.mgr.stats()["tiers"]["p2p"]["promotion_failures"] == 2


def test_a_prefill_engine_pulls_nothing(peers: StartPeer, engines: MakeEngine) -> None:
    other = peers({"seed": "x", "n": 2})
    prefill = engines({"peers": [other.endpoint], "role": "remote_decoder"})
    assert prefill.wait_ready()
    assert prefill.settle(keys_for("x", 2)) == [MISS] * 2
