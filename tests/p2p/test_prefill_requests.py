"""Per-request roles: a request whose vLLM `kv_transfer_params` name its
`remote_prefiller` gets that peer's blocks as hits at once (no probe), on a
decode engine whose tier has the default role; other requests probe. And the
serving side's checksums follow its pool: a key stored again from other bytes is
pulled with its new bytes. A serving engine in a child process, an in-process
puller; every loaded block's bytes checked."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers_p2p.pull import prefills as prefills_mod
from kvtiers_p2p.pull.link import PeerLink
from kvtiers_p2p.pull.prefills import Prefills

from tests.p2p.conftest import MakeEngine, Peer, StartPeer
from tests.p2p.engine import BB, FAST, SLOTS, Engine, block_data, keys_for, wait_for
from tests.p2p.nodes import Node

HIT, MISS = LookupResult.HIT, LookupResult.MISS
PENDING, RETRY = LookupResult.HIT_PENDING, LookupResult.RETRY


def prefiller(peer: Peer) -> dict[str, Any]:
    """The `kv_transfer_params` of a request whose prefill node is `peer`."""
    host, port = peer.endpoint.removeprefix("tcp://").rsplit(":", 1)
    return {"remote_prefiller": {"remote_host": host, "remote_port": int(port)}}


def settle(engine: Engine, keys: list[BlockKey], request_id: str,
           timeout: float = 20.0) -> list[LookupResult]:
    """`Engine.settle` with the lookups made for `request_id`."""
    end = time.monotonic() + timeout
    while True:
        engine.mgr.step()
        answers = [engine.mgr.lookup(k, request_id=request_id) for k in keys]
        if all(a in (HIT, MISS) for a in answers) or time.monotonic() > end:
            return answers
        time.sleep(0.005)



def test_a_request_naming_its_prefiller_gets_its_blocks_at_once(
    peers: StartPeer, engines: MakeEngine
) -> None:
    prefill = peers({"seed": "pd", "n": 8})
    decode = engines({})  # the default role: remote_kv_source, no peers configured
    assert decode.tier.answers_in_request() and decode.mgr.request_lookups
    decode.mgr.on_request_start("req-pd", prefiller(prefill))
    assert decode.wait_ready()
    keys = keys_for("pd", 8)
    mine, others = keys[:4], keys[4:]
    # No probe: the first lookup is a hit (the manager: a promotion on its way).
    assert [decode.mgr.lookup(k, request_id="req-pd") for k in mine] == [PENDING] * 4
    assert decode.mgr.counters["retries"] == 0
    assert settle(decode, mine, "req-pd") == [HIT] * 4
    decode.check_loaded(mine)
    assert decode.mgr.stats()["tiers"]["p2p"]["promoted_hits"] == 4
    # Without the params - no request, or another one - the tier probes first.
    assert decode.mgr.lookup(others[0]) is RETRY
    assert decode.mgr.lookup(others[1], request_id="req-plain") is RETRY
    decode.mgr.on_request_start("req-plain", None)
    assert settle(decode, others, "req-plain") == [HIT] * 4
    decode.check_loaded(others)


def test_a_key_the_prefiller_lacks_is_a_miss_for_miss_ttl(
    peers: StartPeer, engines: MakeEngine
) -> None:
    prefill = peers({"seed": "pd", "n": 2})
    decode = engines({"miss_ttl_s": 120})
    decode.mgr.on_request_start("r", prefiller(prefill))
    assert decode.wait_ready()
    absent, held = keys_for("absent", 2), keys_for("pd", 2)
    assert [decode.mgr.lookup(k, request_id="r") for k in absent] == [PENDING] * 2
    assert settle(decode, absent, "r") == [MISS] * 2  # fetched, not there
    p2p = decode.mgr.stats()["tiers"]["p2p"]
    assert p2p["promotion_failures"] == 2
    # Within miss_ttl_s a miss at once: no second fetch, no probe.
    assert [decode.mgr.lookup(k, request_id="r") for k in absent] == [MISS] * 2
    decode.mgr.step()
    assert decode.mgr.stats()["tiers"]["p2p"]["promotion_failures"] == 2
    # What the prefiller holds is still a hit at once.
    assert [decode.mgr.lookup(k, request_id="r") for k in held] == [PENDING] * 2
    assert settle(decode, held, "r") == [HIT] * 2
    decode.check_loaded(held)


def test_a_failed_key_is_asked_for_again_after_miss_ttl(
    peers: StartPeer, engines: MakeEngine
) -> None:
    prefill = peers({"seed": "pd", "n": 2})
    decode = engines({"miss_ttl_s": 0.3})
    decode.mgr.on_request_start("r", prefiller(prefill))
    assert decode.wait_ready()
    absent = keys_for("absent", 1)
    assert decode.mgr.lookup(absent[0], request_id="r") is PENDING
    assert settle(decode, absent, "r") == [MISS]
    # Not a miss for good: once the memory of the failure is over, a hit again.
    assert wait_for(lambda: decode.mgr.lookup(absent[0], request_id="r") is PENDING)


def test_a_finished_request_leaves_nothing_behind(
    peers: StartPeer, engines: MakeEngine
) -> None:
    prefill = peers({"seed": "pd", "n": 6})
    decode = engines({})
    decode.mgr.on_request_start("r", prefiller(prefill))
    assert decode.wait_ready()
    keys = keys_for("pd", 6)
    assert [decode.mgr.lookup(k, request_id="r") for k in keys[:3]] == [PENDING] * 3
    assert len(decode.tier.prefills) == 1 and decode.tier.prefills.named == 3
    assert settle(decode, keys[:3], "r") == [HIT] * 3
    decode.check_loaded(keys[:3])
    decode.mgr.on_request_finished("r")
    assert len(decode.tier.prefills) == 0 and decode.tier.prefills.named == 0
    # The same id now is any request's: probed.
    assert decode.mgr.lookup(keys[3], request_id="r") is RETRY
    assert settle(decode, keys[3:], "r") == [HIT] * 3
    decode.check_loaded(keys[3:])


def test_a_request_naming_a_source_keeps_probing(
    peers: StartPeer, engines: MakeEngine
) -> None:
    source = peers({"seed": "kv", "n": 2})
    decode = engines({})
    params = {"remote_kv_source": prefiller(source)["remote_prefiller"]}
    decode.mgr.on_request_start("r", params)
    assert decode.wait_ready()
    keys = keys_for("kv", 2)
    assert decode.mgr.lookup(keys[0], request_id="r") is RETRY
    assert settle(decode, keys, "r") == [HIT] * 2
    decode.check_loaded(keys)
    assert len(decode.tier.prefills) == 0


def test_the_request_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefills_mod, "MAX_REQUESTS", 3)
    monkeypatch.setattr(prefills_mod, "MAX_REQUEST_KEYS", 4)
    monkeypatch.setattr(prefills_mod, "MAX_NAMED", 6)
    a, b = cast("PeerLink", object()), cast("PeerLink", object())
    p = Prefills()
    keys = keys_for("bound", 20)
    for i in range(5):
        p.start(f"r{i}", a if i % 2 else b)
    assert len(p) == 3 and p.link("r0") is None and p.link("r4") is b  # the oldest went
    assert [p.name("r2", k) for k in keys[:5]] == [True] * 4 + [False]  # per request
    assert [p.name("r3", k) for k in keys[5:9]] == [True] * 4
    assert p.named == 6  # in all: the oldest forgotten
    assert p.holder(keys[0]) is None and p.holder(keys[2]) is b and p.holder(keys[8]) is a
    assert not p.name("nobody", keys[10])
    p.start("r5", a)  # r2 is now the oldest: it goes, with what it named
    assert p.link("r2") is None and p.holder(keys[2]) is None and p.named == 4
    p.finish("r3")
    assert p.named == 0 and len(p) == 2


def test_a_key_stored_again_from_other_bytes_is_pulled_with_them(
    peers: StartPeer, engines: MakeEngine
) -> None:
    server = peers({"seed": "cs", "n": 4})
    puller = engines({"peers": [server.endpoint]})
    assert puller.wait_ready()
    keys = keys_for("cs", 4)
    assert puller.settle(keys) == [HIT] * 4  # the server summed each block once
    puller.check_loaded(keys)
    # The server's pool evicts them and stores other bytes under the same keys.
    assert server.proc.stdin is not None
    server.proc.stdin.write('{"restore": {"seed": "cs", "n": 4, "salt": "v2"}}\n')
    server.proc.stdin.flush()
    assert server.readline() == "DONE", server.log()
    puller.mgr.reset()  # the puller's copies go: it pulls them again
    assert puller.settle(keys) == [HIT] * 4, puller.mgr.stats()["tiers"]["p2p"]
    slots = puller.mgr.prepare_load(keys)
    try:
        for key, slot in zip(keys, slots, strict=True):
            got = bytes(puller.pool.block(slot))
            assert got == block_data(key, puller.pool.block_bytes, "v2")
            assert got != block_data(key, puller.pool.block_bytes)
    finally:
        puller.mgr.complete_load(keys)
    assert puller.mgr.stats()["tiers"]["p2p"].get("promotion_failures", 0) == 0


def test_a_node_ships_the_bytes_pushed_last_under_a_key(
    tmp_path: Path, engines: MakeEngine
) -> None:
    """A cache node takes a pushed block's checksum with it; evicted, and pushed
    again from other bytes, the key is pulled with the new ones."""
    node = Node({"cpu_bytes_to_use": SLOTS * BB,
                 "secondary_tiers": [{"type": "p2p", "port": 0, **FAST}]}, tmp_path)
    try:
        writer = engines({"peers": [node.endpoint], "push": True})
        puller = engines({"peers": [node.endpoint]})
        assert writer.wait_ready() and puller.wait_ready()
        keys = keys_for("pushed", 4)
        writer.store(keys)
        assert puller.settle(keys) == [HIT] * 4
        puller.check_loaded(keys)
        writer.store(keys_for("filler", SLOTS))  # the node evicts the first ones
        assert all(writer.mgr.slot_of(k) is None for k in keys)  # the writer's too
        writer.store(keys, salt="v2")  # pushed again: the node did not hold them
        puller.mgr.reset()
        assert puller.settle(keys) == [HIT] * 4
        slots = puller.mgr.prepare_load(keys)
        try:
            for key, slot in zip(keys, slots, strict=True):
                assert bytes(puller.pool.block(slot)) == block_data(key, BB, "v2")
        finally:
            puller.mgr.complete_load(keys)
    finally:
        node.kill()
