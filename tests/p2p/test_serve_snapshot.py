"""`kvtiers serve --snapshot-save / --snapshot-load`: a node saves its CPU pool when
stopped, and a fresh node pre-warmed from that snapshot serves every block to an
engine that never pushed to it - pulled byte for byte; another model's snapshot
is refused before the node serves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kvtiers.contract.lookup import LookupResult

from tests.p2p.conftest import ROOT, MakeEngine, child_env
from tests.p2p.engine import BB, FAST, SLOTS, keys_for

pytest.importorskip("zarr")

GEOMETRY = ["--layers", "1", "--kv-heads", "1", "--head-size", str(BB // 2), "--dtype",
            "uint8", "--tokens-per-block", "1"]  # make_namespace's geometry for BB
CONFIG = json.dumps({"cpu_bytes_to_use": SLOTS * BB,
                     "secondary_tiers": [{"type": "p2p", "port": 0, **FAST}]})


def _start(tmp_path: Path, name: str, *args: str, model: str = "kvtiers-p2p-tests/model"
           ) -> tuple[Any, Path]:
    ready = tmp_path / f"{name}.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtiers", "serve", "--config", CONFIG, "--model", model,
         *GEOMETRY, "--ready-file", str(ready), "--status-every", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    return proc, ready


def _endpoint(proc: Any, ready: Path) -> str:
    end = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > end:
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"the node did not start: {err[-3000:]}")
        time.sleep(0.02)
    endpoint: str = json.loads(ready.read_text())["endpoints"][0]
    return endpoint


def _stop(proc: Any) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    return out, err


def test_a_node_saves_its_pool_and_a_fresh_node_starts_warm(
        tmp_path: Path, engines: MakeEngine) -> None:
    url = str(tmp_path / "node-pool.zarr")
    procs = []
    try:
        first, ready = _start(tmp_path, "first", "--snapshot-save", url)
        procs.append(first)
        a = engines({"peers": [_endpoint(first, ready)], "push": True})
        assert a.wait_ready()
        keys = keys_for("warm", 12)
        a.store(keys)  # pushed into the first node's pool
        out, _ = _stop(first)
        assert f"saved the pool's 12 blocks to {url}" in out
        second, ready = _start(tmp_path, "second", "--snapshot-load", url)
        procs.append(second)
        b = engines({"peers": [_endpoint(second, ready)]})  # never pushed anything
        assert b.wait_ready()
        assert b.settle(keys) == [LookupResult.HIT] * 12
        b.check_loaded(keys)  # byte for byte, from the pre-warmed pool
        out, _ = _stop(second)
        assert "pre-warmed the pool with 12 blocks" in out
        # another model's node refuses the snapshot, before it serves
        other, ready = _start(tmp_path, "other", "--snapshot-load", url, model="other/model")
        procs.append(other)
        _, err = other.communicate(timeout=60)
        assert other.returncode == 2 and "refusing to load" in err, err[-3000:]
        assert "kvtiers-p2p-tests/model" in err and "other/model" in err
        assert not ready.exists() and "Traceback" not in err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=60)


def test_a_save_target_of_user_files_or_another_snapshot_is_refused_before_serving(
        tmp_path: Path) -> None:
    """`--snapshot-save` is checked when the node starts, not when it stops: a
    directory of other files is refused (exit 2, named, left intact), and so is an
    existing snapshot without `--snapshot-overwrite`."""
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "a.txt").write_text("a\n")
    proc, ready = _start(tmp_path, "victim", "--snapshot-save", str(victim),
                         "--snapshot-overwrite")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err[-3000:]
    assert str(victim) in err and "(sub)" in err and "Traceback" not in err
    assert not ready.exists()
    assert os.listdir(victim) == ["sub"] and (victim / "sub" / "a.txt").read_text() == "a\n"
    from kvtiers.ops.snapshot_store import SnapshotWriter
    from kvtiers.testing import make_namespace

    snap = tmp_path / "snap"
    with SnapshotWriter(str(snap), make_namespace("kvtiers-p2p-tests/model", BB), BB) as w:
        w.close()  # an empty snapshot: a kvtiers one all the same
    before = sorted(p.name for p in snap.rglob("*"))
    proc, ready = _start(tmp_path, "again", "--snapshot-save", str(snap))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--snapshot-overwrite" in err, err[-3000:]
    assert not ready.exists() and sorted(p.name for p in snap.rglob("*")) == before
