"""The NIXL data plane (UCX): blocks READ from a peer process's pool into the
puller's slots, verified there. These run when NIXL imports here (the
`kvtiers-p2p[nixl]` extra) and are skipped otherwise; the tests of the refusal
without NIXL run always (NIXL's import made to fail)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers.errors import ConfigError
from kvtiers.testing import make_context
from kvtiers_p2p.tier import P2PTier
from kvtiers_p2p.wire.nixl_plane import nixl_available

from tests.p2p import netns
from tests.p2p.conftest import ROOT, MakeEngine, StartPeer, child_env
from tests.p2p.engine import keys_for

needs_nixl = pytest.mark.skipif(not nixl_available(), reason="NIXL does not import here "
                                "(pip install 'kvtiers-p2p[nixl]')")
HIT = LookupResult.HIT
NIXL = {"data_plane": "nixl"}


@pytest.fixture
def no_nixl(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """NIXL's modules fail to import, as where it is not installed."""
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> ModuleType:
        if name.split(".")[0] in ("nixl", "nixl_cu12", "nixl_cu13"):
            raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake)  # what load_nixl calls
    yield


def test_nixl_required_without_nixl_is_refused_naming_the_install(no_nixl: None) -> None:
    with pytest.raises(ConfigError) as info:
        P2PTier(make_context(16384, 8), {"data_plane": "nixl"})
    text = str(info.value)
    assert "$.data_plane" in text and "kvtiers-p2p[nixl]" in text, text
    assert "nixl_cu12" in text  # why each candidate failed


def test_auto_without_nixl_offers_zeromq_frames(no_nixl: None) -> None:
    tier = P2PTier(make_context(16384, 8), {"data_plane": "auto"})
    try:
        assert tier.data_planes == ("zmq",)
    finally:
        tier.close()


@needs_nixl
def test_blocks_are_read_over_nixl_from_another_process(
        peers: StartPeer, engines: MakeEngine) -> None:
    server = peers({"seed": "a", "n": 24, "tier": {"port": 0, **NIXL}})
    puller = engines({"peers": [server.endpoint], **NIXL})
    assert puller.wait_ready()
    link = next(iter(puller.tier.links.values()))
    assert link.plane == "nixl"
    keys = keys_for("a", 24)
    assert puller.settle(keys) == [HIT] * 24
    puller.check_loaded(keys)  # bytes compared with what the server stored
    plane = puller.tier.nixl
    assert plane is not None and plane.reads >= 1
    assert puller.mgr.stats()["tiers"]["p2p"]["blocks_read"] == 24


@needs_nixl
def test_large_blocks_over_nixl(peers: StartPeer, engines: MakeEngine) -> None:
    bb = 2 << 20
    server = peers({"seed": "big", "n": 16, "block_bytes": bb, "slots": 16,
                    "tier": {"port": 0, **NIXL}})
    puller = engines({"peers": [server.endpoint], **NIXL}, block_bytes=bb, slots=16)
    assert puller.wait_ready()
    keys = keys_for("big", 16)
    assert puller.settle(keys) == [HIT] * 16
    puller.check_loaded(keys)


@needs_nixl
@pytest.mark.parametrize("streams", [1, 2])
def test_a_pipelined_load_moves_on_every_stream(
        peers: StartPeer, engines: MakeEngine, streams: int) -> None:
    """A load of more blocks than one fetch takes (2 MiB blocks: 8 per fetch) is
    cut into fetches; with two transfer streams both move them, each verifying
    what it moved; every byte lands where it belongs."""
    bb, n = 2 << 20, 40
    server = peers({"seed": "pipe", "n": n, "block_bytes": bb, "slots": n,
                    "tier": {"port": 0, **NIXL}})
    puller = engines({"peers": [server.endpoint], "transfer_streams": streams, **NIXL},
                     block_bytes=bb, slots=n)
    assert puller.wait_ready()
    keys = keys_for("pipe", n)
    assert puller.settle(keys) == [HIT] * n
    puller.check_loaded(keys)
    plane = puller.tier.nixl
    assert plane is not None and plane.streams == streams
    assert len(plane.stream_reads) == streams and all(plane.stream_reads), plane.stream_reads


@needs_nixl
def test_a_server_without_nixl_is_served_over_zeromq(
        peers: StartPeer, engines: MakeEngine) -> None:
    server = peers({"seed": "a", "n": 8, "tier": {"port": 0, "data_plane": "zmq"}})
    puller = engines({"peers": [server.endpoint], "data_plane": "auto"})
    assert puller.wait_ready()
    assert next(iter(puller.tier.links.values())).plane == "zmq"
    keys = keys_for("a", 8)
    assert puller.settle(keys) == [HIT] * 8
    puller.check_loaded(keys)


@needs_nixl
def test_nixl_only_sides_refuse_a_zeromq_only_peer(
        peers: StartPeer, engines: MakeEngine) -> None:
    server = peers({"seed": "a", "n": 2, "tier": {"port": 0, "data_plane": "zmq"}})
    puller = engines({"peers": [server.endpoint], **NIXL})
    assert not puller.wait_ready(timeout=3.0)
    link = next(iter(puller.tier.links.values()))
    assert link.state == "refused" and "no common data plane" in link.reason


@needs_nixl
@pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))
def test_blocks_are_read_over_nixl_across_network_namespaces(peers: StartPeer) -> None:
    with netns.veth_pair() as pair:
        server = peers({"seed": "a", "n": 16,
                        "tier": {"host": pair.addr_a, "port": 0, **NIXL}},
                       prefix=pair.prefix(pair.a))
        spec = {"tier": {"peers": [server.endpoint], **NIXL}, "seed": "a", "n": 16}
        out = subprocess.run(
            [*pair.prefix(pair.b), sys.executable, "-m", "tests.p2p.puller", json.dumps(spec)],
            capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        server.kill()
    assert result["ready"] is True and result["plane"] == "nixl"
    assert result["answers"] == ["hit"] * 16
    assert result["verified"] == 16 and result["wrong"] == 0
