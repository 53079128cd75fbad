"""`kvtiers serve`: a standalone cache node in a process of its own. Engines
cascade into it (push) and pull from it; its fs tier below keeps what it was
given across a restart of the node; SIGTERM stops it cleanly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvtiers.contract.lookup import LookupResult

from tests.clirun import run_kvtiers
from tests.p2p.conftest import ROOT, MakeEngine, child_env
from tests.p2p.engine import BB, FAST, SLOTS, keys_for
from tests.p2p.nodes import Node


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Any]:
    made: list[Node] = []

    def start(config: dict[str, Any]) -> Node:
        node = Node(config, tmp_path)
        made.append(node)
        return node

    yield start
    for node in made:
        node.kill()


def node_config(tmp_path: Path, fs: bool = False) -> dict[str, Any]:
    tiers: list[dict[str, Any]] = [{"type": "p2p", "port": 0, **FAST}]
    if fs:
        root = tmp_path / "fs"
        root.mkdir(exist_ok=True)
        tiers.append({"type": "fs", "root_dir": str(root), "capacity_bytes": 64 << 20,
                      "shared": False})
    return {"cpu_bytes_to_use": SLOTS * BB, "secondary_tiers": tiers}


def test_help() -> None:
    out = run_kvtiers(["serve", "--help"],
                      env=child_env(), cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout and "SIGTERM" in out.stdout


def test_two_engines_cascade_into_a_node_and_pull_from_it(
        tmp_path: Path, nodes: Any, engines: MakeEngine) -> None:
    node = nodes(node_config(tmp_path))
    a = engines({"peers": [node.endpoint], "push": True})
    b = engines({"peers": [node.endpoint]})
    assert a.wait_ready() and b.wait_ready()
    keys_a, keys_b = keys_for("from-a", 8), keys_for("from-b", 8)
    a.store(keys_a)  # written through to the node
    b.store(keys_b)  # b does not push: the node never sees these
    assert a.mgr.stats()["tiers"]["p2p"]["cascaded_blocks"] == 8
    assert b.settle(keys_a) == [LookupResult.HIT] * 8
    b.check_loaded(keys_a)
    assert a.settle(keys_b) == [LookupResult.MISS] * 8
    code, out, err = node.terminate()
    assert code == 0, err[-3000:]
    assert "stored 8" in out and out.rstrip().endswith("kvtiers serve: stopped")


def test_a_node_keeps_blocks_in_its_fs_tier_across_a_restart(
        tmp_path: Path, nodes: Any, engines: MakeEngine) -> None:
    node = nodes(node_config(tmp_path, fs=True))
    a = engines({"peers": [node.endpoint], "push": True})
    assert a.wait_ready()
    keys = keys_for("kept", 8)
    a.store(keys)
    code, _, err = node.terminate()  # drains its cascades into fs, then stops
    assert code == 0, err[-3000:]
    again = nodes(node_config(tmp_path, fs=True))
    # The pool is empty; the node promotes from fs when a lookup reaches it.
    b = engines({"peers": [again.endpoint], "pending_wait_s": 5.0})
    assert b.wait_ready()
    assert b.settle(keys, timeout=60) == [LookupResult.HIT] * 8
    b.check_loaded(keys)


def test_keygen_command(tmp_path: Path) -> None:
    out = run_kvtiers(["p2p", "keygen", str(tmp_path / "k"),
                      "--name", "node"],
                      env=child_env(), cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    secret = tmp_path / "k" / "node.key_secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and (tmp_path / "k" / "node.key").exists()
    assert secret.read_text() not in out.stdout + out.stderr


def test_the_plugin_listing_names_the_tier_and_its_commands() -> None:
    out = run_kvtiers(["plugins", "--json"],
                      env=child_env(), cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    text = json.dumps(rows)
    assert '"p2p"' in text and '"serve"' in text, text[:2000]
