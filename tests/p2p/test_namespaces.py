"""Two engine processes in two network namespaces joined by a veth pair (made and
removed by the test, also when it fails): blocks pulled across, bytes verified; a
mismatched peer refused across them too."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.p2p import netns
from tests.p2p.conftest import ROOT, StartPeer, child_env

pytestmark = pytest.mark.skipif(netns.available() is not None,
                                reason=str(netns.available()))


@pytest.fixture
def pair() -> Iterator[netns.Pair]:
    with netns.veth_pair() as p:
        yield p


def pull(pair: netns.Pair, spec: dict[str, object]) -> dict[str, object]:
    out = subprocess.run(
        [*pair.prefix(pair.b), sys.executable, "-m", "tests.p2p.puller", json.dumps(spec)],
        capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_blocks_are_pulled_across_namespaces(pair: netns.Pair, peers: StartPeer) -> None:
    server = peers({"seed": "a", "n": 16, "tier": {"host": pair.addr_a, "port": 0}},
                   prefix=pair.prefix(pair.a))
    assert server.endpoint.startswith(f"tcp://{pair.addr_a}:")
    result = pull(pair, {"tier": {"peers": [server.endpoint]}, "seed": "a", "n": 16})
    assert result["ready"] is True
    assert result["answers"] == ["hit"] * 16
    assert result["verified"] == 16 and result["wrong"] == 0


def test_the_namespaces_do_not_reach_each_other_by_loopback(
        pair: netns.Pair, peers: StartPeer) -> None:
    """The server listens on its own namespace's veth address only: a puller in the
    other namespace that dials loopback finds nobody (the fixture isolates)."""
    server = peers({"seed": "a", "n": 2, "tier": {"host": "127.0.0.1", "port": 0}},
                   prefix=pair.prefix(pair.a))
    result = pull(pair, {"tier": {"peers": [server.endpoint]}, "seed": "a", "n": 2,
                         "ready_s": 2.0})
    assert result["ready"] is False and result["answers"] == ["miss"] * 2


def test_a_cross_namespace_peer_is_refused_across_namespaces(
        pair: netns.Pair, peers: StartPeer) -> None:
    server = peers({"seed": "a", "n": 4, "model": "another-model",
                    "tier": {"host": pair.addr_a, "port": 0}}, prefix=pair.prefix(pair.a))
    result = pull(pair, {"tier": {"peers": [server.endpoint]}, "seed": "a", "n": 4,
                         "ready_s": 3.0})
    assert result["answers"] == ["miss"] * 4 and result["verified"] == 0
    assert result["state"] == "refused"
    assert "namespace mismatch" in str(result["reason"])
