"""The handshake: peers that would exchange keys meaning other bytes are refused,
with a reason both sides log; the refused side gets nothing (misses)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers.sdk import BlockGeometry, Namespace
from kvtiers_p2p.wire.handshake import (
    Identity,
    choose_plane,
    describe_namespace,
    refusal,
    seed_fingerprint,
)
from kvtiers_p2p.wire.protocol import PROTOCOL_VERSION, DataPlane, Hello

from tests.clirun import run_kvtiers
from tests.p2p.conftest import ROOT, MakeEngine, Peer, StartPeer, child_env
from tests.p2p.engine import BB, keys_for
from tests.p2p.nodes import Node

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
    verdict = refusal(OURS, hello(**change), endpoint="tcp://127.0.0.1:5710")
    assert verdict is not None
    for word in words:
        assert word in verdict.for_server and word in verdict.for_puller
    # Each side reads the sides in its own words: the server names the puller by
    # its id, the puller itself "this engine" - never the other way round.
    assert "peer 'puller'" in verdict.for_server
    assert "this engine" in verdict.for_puller and "'puller'" not in verdict.for_puller
    if "slots of" not in words[0]:  # the puller's own slots: nothing of the server's
        assert "this engine" in verdict.for_server  # the server is an engine here
        assert "the peer at tcp://127.0.0.1:5710" in verdict.for_puller


def test_a_namespace_refusal_says_model_revision_and_geometry_of_each_side() -> None:
    """The puller is told "this engine: <its namespace>; the node at ADDR: <the
    node's>", the node logs "peer 'ID': <the puller's>; this node: <its own>" -
    in words a user compares with the flags of `kvtiers serve`, not fingerprints."""
    engine_ns = Namespace("kvtiers-bench", (BlockGeometry(2, 2, 32, "bfloat16", 16),),
                          "content-v1")
    node_ns = Namespace("meta-llama/Llama-3.1-8B",
                        (BlockGeometry(32, 8, 128, "bfloat16", 16),))
    node = Identity("node-1", node_ns.fingerprint, seed_fingerprint("0"), 16384, ("zmq",),
                    describe_namespace(node_ns))
    engine = Identity("engine-1", engine_ns.fingerprint, seed_fingerprint("0"), 16384,
                      ("zmq",), describe_namespace(engine_ns))
    verdict = refusal(node, engine.hello(PLANE), endpoint="tcp://10.0.0.7:5710", node=True)
    assert verdict is not None
    ours = ("model kvtiers-bench revision content-v1, geometry layers=2 kv_heads=2 "
            "head_size=32 dtype=bfloat16 tokens_per_block=16 tp_size=1")
    theirs = ("model meta-llama/Llama-3.1-8B revision (none), geometry layers=32 "
              "kv_heads=8 head_size=128 dtype=bfloat16 tokens_per_block=16 tp_size=1")
    assert (f"namespace mismatch: this engine: {ours}, format 2; the node at "
            f"tcp://10.0.0.7:5710: {theirs}, format 2.") in verdict.for_puller
    assert (f"namespace mismatch: peer 'engine-1': {ours}, format 2; this node: "
            f"{theirs}, format 2.") in verdict.for_server
    for text in (verdict.for_puller, verdict.for_server):  # what to do, for a bench
        assert "kvtiers serve --model kvtiers-bench --revision content-v1" in text


def test_a_refusal_names_fingerprints_where_the_words_are_the_same() -> None:
    """A namespace the words leave no difference in (another format version), or
    a puller that does not describe its own: the fingerprints say which."""
    same = "model m revision r, geometry layers=1 kv_heads=1, format 2"
    server = Identity("s", "ns-1", seed_fingerprint("0"), 16384, ("zmq",), same)
    verdict = refusal(server, hello(namespace="ns-2", described=same))
    assert verdict is not None and "(namespace ns-2)" in verdict.for_puller
    assert "(namespace ns-1)" in verdict.for_puller
    bare = refusal(server, hello(namespace="ns-2"))
    assert bare is not None and "namespace ns-2 (not described)" in bare.for_server


def test_the_seed_itself_never_travels() -> None:
    secret = "my-secret-seed-1234"
    fingerprint = seed_fingerprint(secret)
    assert secret not in fingerprint and len(fingerprint) == 16
    verdict = refusal(OURS, hello(hash_seed=fingerprint))
    assert verdict is not None
    assert secret not in verdict.for_server and secret not in verdict.for_puller


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


# ------------------------------------------------- `kvtiers bench` against a node

BENCH_NS = ("model kvtiers-bench revision content-v1, geometry layers=2 kv_heads=2 "
            "head_size=32 dtype=bfloat16 tokens_per_block=16 tp_size=1, format 2")


def run_bench(node: Node, tmp: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`kvtiers bench` (preset tiny, a pool too small for the workload) whose p2p
    tier pushes into and pulls from `node`: the finished process and its JSON."""
    from tests.bench.conftest import TINY, small_pool

    config = {"cpu_bytes_to_use": small_pool(), "secondary_tiers": [
        {"type": "p2p", "peers": [node.endpoint], "push": True, "data_plane": "zmq"}]}
    out = tmp / f"bench-{time.monotonic_ns()}.json"
    done = run_kvtiers(["bench", "--config", json.dumps(config), *TINY,
                       "--json", str(out)],
                       env=child_env(), cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "all match" in done.stdout
    return done, json.loads(out.read_text())["result"]


def test_a_bench_refused_by_a_node_of_another_model_is_told_both_namespaces(
        tmp_path: Path) -> None:
    """docs/tiers/p2p.md's `kvtiers serve --model meta-llama/...` node and a
    `kvtiers bench`: the bench runs on with misses, and its line says, the right
    way round, what this engine is and what the node at its address is; the
    node's line says the same from its side."""
    node = Node({"cpu_bytes_to_use": 64 * BB, "secondary_tiers": [
        {"type": "p2p", "host": "127.0.0.1", "port": 0, "data_plane": "zmq"}]}, tmp_path,
        model="meta-llama/Llama-3.1-8B")
    try:
        done, result = run_bench(node, tmp_path)
    finally:
        _, _, node_err = node.terminate()
    theirs = (f"model meta-llama/Llama-3.1-8B revision (none), geometry layers=1 "
              f"kv_heads=1 head_size={BB // 2} dtype=uint8 tokens_per_block=1 tp_size=1")
    assert (f"the peer at {node.endpoint} refused this engine: namespace mismatch: this "
            f"engine: {BENCH_NS}; the node at {node.endpoint}: {theirs}") in done.stderr, (
        done.stderr[-3000:])
    assert "kvtiers serve --model kvtiers-bench --revision content-v1" in done.stderr
    assert result["tiers"]["p2p"]["tokens_served"] == 0
    said = re.search(r"refused peer '([^']+)': namespace mismatch: peer '([^']+)': "
                     + re.escape(f"{BENCH_NS}; this node: {theirs}"), node_err)
    assert said is not None and said.group(1) == said.group(2), node_err[-3000:]


def test_the_documented_node_for_a_bench_serves_it(tmp_path: Path) -> None:
    """docs/tiers/p2p.md's table of `kvtiers serve` flags for each bench preset
    matches the presets, and a node started with the flags of `tiny` serves a
    `kvtiers bench --model tiny` (pushed into it, pulled back, bytes verified)."""
    from kvtiers.bench.presets import PRESETS

    doc = (ROOT / "docs" / "tiers" / "p2p.md").read_text()
    rows = dict(re.findall(r"^\| `([\w.-]+)`[^|]*\| `(--layers [^`]+)` \|$", doc, re.M))
    assert set(rows) == set(PRESETS), rows
    for name, flags in rows.items():
        g = PRESETS[name]
        assert flags.split() == [
            "--layers", str(g.layers), "--kv-heads", str(g.kv_heads), "--head-size",
            str(g.head_size), "--dtype", g.dtype, "--tokens-per-block",
            str(g.block_tokens)], name
    serve = re.search(r"^kvtiers serve --config node\.json (--model kvtiers-bench "
                      r"--revision content-v1) \\$", doc, re.M)
    assert serve is not None, "the documented kvtiers serve command"
    # `Node` gives its own geometry flags first: the documented ones, later, win.
    node = Node({"cpu_bytes_to_use": 4096 * 8192, "secondary_tiers": [
        {"type": "p2p", "host": "127.0.0.1", "port": 0, "data_plane": "zmq"}]}, tmp_path,
        *serve.group(1).split()[2:], *rows["tiny"].split(), model="kvtiers-bench")
    try:
        done, result = run_bench(node, tmp_path)
    finally:
        rc, _, node_err = node.terminate()
    assert rc == 0 and "refused" not in node_err + done.stderr, node_err[-3000:]
    p2p = result["tiers"]["p2p"]
    assert p2p["tokens_served"] > 0 and p2p["errors"] == {}, p2p
