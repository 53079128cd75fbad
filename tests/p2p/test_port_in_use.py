"""A port another socket holds (DESIGN invariant 5: a tier that fails costs misses,
not errors). `kvtiers serve`, whose only work is serving, says which address and
why, and exits 2 without a traceback; an engine's p2p tier serves no peers, says so
once, counts it, and goes on pulling from its peers; `kvtiers bench` with such a
tier runs to its end. A `--metrics-port` in use stops `kvtiers serve` and `kvtiers
bench` before they start, exit 2. Real processes and sockets on loopback."""

from __future__ import annotations

import errno
import json
import logging
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvtiers import build_manager, load_config
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.pool_view import PoolView
from kvtiers.testing import make_namespace

from tests.clirun import run_kvtiers
from tests.p2p.conftest import ROOT, MakeEngine, child_env
from tests.p2p.engine import BB, FAST, MODEL, SLOTS, keys_for
from tests.p2p.nodes import geometry


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port held by a listening socket of this process."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_kvtiers_serve_on_a_taken_port_exits_2_naming_the_address(taken: int) -> None:
    config = {"cpu_bytes_to_use": SLOTS * BB, "secondary_tiers": [
        {"type": "p2p", "host": "127.0.0.1", "port": taken, "data_plane": "zmq", **FAST}]}
    done = run_kvtiers(["serve", "--config", json.dumps(config),
                       "--model", MODEL, *geometry(BB), "--status-every", "0"],
                       env=child_env(), cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert (f"kvtiers serve: cannot listen on tcp://127.0.0.1:{taken}: the address is in "
            "use") in done.stderr, done.stderr
    assert ("pick another port (the config's secondary_tiers[0].port; 0 picks a free one)"
            in done.stderr), done.stderr  # what to change
    assert "ZMQError" not in done.stderr


def test_an_engine_tier_on_a_taken_port_serves_nothing_and_still_pulls(
        taken: int, engines: MakeEngine, caplog: pytest.LogCaptureFixture) -> None:
    from kvtiers_p2p.serve.server import ListenError

    source = engines({"port": 0, "host": "127.0.0.1"})
    with caplog.at_level(logging.WARNING):
        engine = engines({"port": taken, "host": "127.0.0.1", "peers": [source.endpoint]})
    tier = engine.tier
    assert tier.server is None
    assert isinstance(tier.serve_error, ListenError)
    assert tier.serve_error.errno == errno.EADDRINUSE
    assert tier.stats().errors == {"serve.EADDRINUSE": 1}
    warned = [r.getMessage() for r in caplog.records if "cannot listen" in r.getMessage()]
    assert len(warned) == 1 and f"tcp://127.0.0.1:{taken}" in warned[0], warned
    assert "in use" in warned[0] and "pick another port (the `port` of tier" in warned[0]
    # Pulling is untouched: random blocks stored at the source load here, verified.
    keys = keys_for(f"taken-{uuid.uuid4()}", 6)
    source.store(keys)
    assert engine.wait_ready()
    assert engine.settle(keys) == [LookupResult.HIT] * len(keys)
    engine.check_loaded(keys)
    assert engine.settle(keys_for(f"absent-{uuid.uuid4()}", 2)) == [LookupResult.MISS] * 2


def test_build_manager_with_a_taken_port_returns_a_working_manager(taken: int) -> None:
    config = load_config({"cpu_bytes_to_use": SLOTS * BB, "secondary_tiers": [
        {"type": "p2p", "host": "127.0.0.1", "port": taken, "data_plane": "zmq", **FAST}]})
    pool = PoolView.anonymous(SLOTS, BB)
    mgr = build_manager(config, pool, make_namespace(MODEL, BB))
    try:
        assert mgr.lookup(keys_for(f"m-{uuid.uuid4()}", 1)[0]) is LookupResult.MISS
        mgr.step()
        assert mgr.stats()["tiers"]["p2p"]["errors"] == {"serve.EADDRINUSE": 1}
    finally:
        mgr.close()


def test_kvtiers_bench_with_a_p2p_tier_on_a_taken_port_completes(
        taken: int, tmp_path: Path) -> None:
    from tests.bench.conftest import TINY, small_pool

    config = {"cpu_bytes_to_use": small_pool(), "secondary_tiers": [
        {"type": "p2p", "host": "127.0.0.1", "port": taken, "data_plane": "zmq"}]}
    out = tmp_path / "out.json"
    done = run_kvtiers(["bench", "--config", json.dumps(config), *TINY,
                       "--json", str(out)],
                       env=child_env(), cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "all match" in done.stdout
    assert f"cannot listen on tcp://127.0.0.1:{taken}" in done.stderr
    assert "serve.EADDRINUSE: 1" in done.stdout  # the tiers table's errors column
    p2p = json.loads(out.read_text())["result"]["tiers"]["p2p"]
    assert p2p["tier_errors"] == {"serve.EADDRINUSE": 1}


def test_kvtiers_serve_with_a_taken_metrics_port_exits_2_naming_it(taken: int) -> None:
    config = {"cpu_bytes_to_use": SLOTS * BB, "secondary_tiers": [
        {"type": "p2p", "host": "127.0.0.1", "port": 0, "data_plane": "zmq", **FAST}]}
    done = run_kvtiers(["serve", "--config", json.dumps(config),
                       "--model", MODEL, *geometry(BB), "--status-every", "0", "--metrics-port",
                       str(taken)],
                       env=child_env(), cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert (f"error: cannot serve metrics on http://127.0.0.1:{taken}/metrics: the port is "
            "in use") in done.stderr, done.stderr
    assert "0 picks a free one" in done.stderr


def test_kvtiers_bench_with_a_taken_metrics_port_refuses_before_running(
        taken: int) -> None:
    from tests.bench.conftest import TINY

    done = run_kvtiers(["bench", *TINY, "--metrics-port", str(taken)],
                       env=child_env(), cwd=ROOT, timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (f"error: cannot serve metrics on http://127.0.0.1:{taken}/metrics: the port is "
            "in use") in done.stderr, done.stderr
    assert "verified:" not in done.stdout  # no run started


@pytest.mark.parametrize(("host", "kind", "reason"), [
    ("192.0.2.1", "EADDRNOTAVAIL", "no network interface of this machine has that address"),
    ("no-such-host.invalid", "ENODEV", "does not resolve"),
])
def test_an_engine_tier_on_an_address_it_cannot_bind_answers_miss(
        host: str, kind: str, reason: str, engines: MakeEngine) -> None:
    engine = engines({"port": 0, "host": host})
    assert engine.tier.server is None
    assert engine.tier.stats().errors == {f"serve.{kind}": 1}
    assert reason in str(engine.tier.serve_error)
    assert engine.settle(keys_for(f"n-{uuid.uuid4()}", 2)) == [LookupResult.MISS] * 2


def test_a_server_that_cannot_listen_leaves_nothing_open(taken: int) -> None:
    from kvtiers_p2p.serve.server import ListenError, PeerServer
    from kvtiers_p2p.wire.handshake import Identity

    pool = PoolView.anonymous(SLOTS, BB)
    mgr = build_manager(load_config({"cpu_bytes_to_use": SLOTS * BB}), block_bytes=BB)
    server = PeerServer(mgr, pool, Identity("t", "n", "s", BB, ("zmq",)),
                        bind=f"tcp://127.0.0.1:{taken}")
    with pytest.raises(ListenError) as caught:
        server.start()
    assert caught.value.errno == errno.EADDRINUSE
    assert server._ctx.closed and server.endpoint == ""  # the context's threads ended
    server.close()  # idempotent after a failed start
    mgr.close()


def test_a_node_that_cannot_listen_closes_its_manager_tiers_and_pool(
        taken: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtiers.manager import TieringOffloadingManager
    from kvtiers_p2p.node import cache_node

    managers: list[Any] = []

    class Recorded(TieringOffloadingManager):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.closed_by_node = False
            managers.append(self)

        def close(self) -> None:
            self.closed_by_node = True
            super().close()

    monkeypatch.setattr(cache_node, "TieringOffloadingManager", Recorded)
    config = load_config({"cpu_bytes_to_use": SLOTS * BB, "secondary_tiers": [
        {"type": "p2p", "host": "127.0.0.1", "port": taken}]})
    with pytest.raises(cache_node.CannotListen) as caught:
        cache_node.CacheNode(config, make_namespace(block_bytes=BB))
    assert caught.value.errno == errno.EADDRINUSE
    assert [m.closed_by_node for m in managers] == [True]
