"""`kvtiers serve --metrics-port`: a real cache node's `/metrics` endpoint scraped
while engines push into it and pull from it, parsed with prometheus_client's text
parser; the pulled bytes checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kvtiers.contract.lookup import LookupResult

from tests.clirun import run_kvtiers
from tests.p2p.conftest import ROOT, MakeEngine, child_env
from tests.p2p.engine import BB, FAST, SLOTS, keys_for

pytest.importorskip("prometheus_client")

GEOMETRY = ["--layers", "1", "--kv-heads", "1", "--head-size", str(BB // 2), "--dtype",
            "uint8", "--tokens-per-block", "1"]  # make_namespace's geometry for BB
MODEL = "kvtiers-p2p-tests/model"


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _serve(tmp_path: Path, *args: str, timing: bool = True, fs: bool = False,
           env: dict[str, str] | None = None) -> tuple[Any, Path]:
    tiers: list[dict[str, Any]] = [{"type": "p2p", "port": 0, **FAST}]
    if fs:  # the node cascades what it keeps into an fs tier below it
        (tmp_path / "fs").mkdir()
        tiers.append({"type": "fs", "root_dir": str(tmp_path / "fs"),
                      "capacity_bytes": 64 << 20, "shared": False})
    config = {"cpu_bytes_to_use": SLOTS * BB, "metrics": {"scheduler_call_timing": timing},
              "secondary_tiers": tiers}
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtiers", "serve", "--config", json.dumps(config),
         "--model", MODEL, *GEOMETRY, "--ready-file", str(ready), "--status-every", "0",
         *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or child_env(),
        cwd=ROOT)
    return proc, ready


@pytest.mark.parametrize("timing", [True, False], ids=["timed", "untimed"])
def test_a_node_serves_metrics_while_engines_use_it(
        tmp_path: Path, engines: MakeEngine, timing: bool) -> None:
    proc, ready = _serve(tmp_path, "--metrics-port", "0", timing=timing)
    try:
        url, endpoint = _started(proc, ready)
        before = _scrape(url)
        assert before[("kvtiers_pool_slots", ())] == SLOTS
        assert before[("kvtiers_pool_resident_blocks", ())] == 0
        a = engines({"peers": [endpoint], "push": True})
        b = engines({"peers": [endpoint]})
        assert a.wait_ready() and b.wait_ready()
        keys = keys_for("metered", 8)
        a.store(keys)  # pushed into the node's pool
        assert b.settle(keys) == [LookupResult.HIT] * 8
        b.check_loaded(keys)  # byte for byte, pulled from the node
        deadline = time.monotonic() + 30
        while True:  # the node publishes its stats from its steps, every 0.5 s
            m = _scrape(url)
            if m.get(("kvtiers_pool_resident_blocks", ()), 0) == 8:
                break
            assert time.monotonic() < deadline, m
            time.sleep(0.2)
        assert proc.poll() is None  # scraped while it runs
        assert m[("kvtiers_pool_stored_blocks_total", ())] == 8
        assert m[("kvtiers_tier_usage_bytes", (("tier", "p2p"),))] >= 0
        stores = m.get(("kvtiers_manager_call_seconds_count", (("call", "prepare_store"),)), 0)
        steps = m.get(("kvtiers_manager_call_seconds_count", (("call", "step"),)), 0)
        if timing:
            assert stores >= 1 and steps > 0
        else:
            assert stores == 0 and steps == 0
            assert not any(n.startswith("kvtiers_manager_call_seconds") for n, _ in m)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert out.rstrip().endswith("kvtiers serve: stopped")


def _started(proc: Any, ready: Path) -> tuple[str, str]:
    """The metrics URL and the node's endpoint, once it serves."""
    assert proc.stderr is not None
    line = proc.stderr.readline()  # printed before the node serves
    assert line.startswith("metrics: http://127.0.0.1:"), line
    end = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < end, "the node did not start"
        time.sleep(0.02)
    return line.split()[1], json.loads(ready.read_text())["endpoints"][0]


def test_the_node_s_tiers_report_their_jobs(tmp_path: Path, engines: MakeEngine) -> None:
    """The node builds its tiers with the metrics sink and meters them, as
    `build_manager` does for an engine: the fs tier below the node shows its store
    jobs (an event metric, not one fed from stats)."""
    proc, ready = _serve(tmp_path, "--metrics-port", "0", fs=True)
    try:
        url, endpoint = _started(proc, ready)
        a = engines({"peers": [endpoint], "push": True})
        assert a.wait_ready()
        keys = keys_for("metered-fs", 8)
        a.store(keys)  # pushed into the node's pool, which cascades them into fs
        b = engines({"peers": [endpoint]})
        assert b.wait_ready()
        assert b.settle(keys) == [LookupResult.HIT] * 8
        b.check_loaded(keys)  # byte for byte, pulled from the node
        job = ("kvtiers_tier_job_seconds_count", (("kind", "store"), ("tier", "fs")))
        deadline = time.monotonic() + 30
        while True:
            m = _scrape(url)
            if m.get(job, 0) >= 1 and m.get(
                    ("kvtiers_tier_written_bytes_total", (("tier", "fs"),)), 0) >= 8 * BB:
                break
            assert time.monotonic() < deadline, {k: v for k, v in m.items() if "tier" in k[0]}
            time.sleep(0.2)
        assert proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]


def test_a_bad_port_or_no_prometheus_is_refused_before_serving(tmp_path: Path) -> None:
    proc, ready = _serve(tmp_path, "--metrics-port", "70000")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "65535" in err and "Traceback" not in err, err
    assert not ready.exists()
    env = child_env()  # prometheus_client made unimportable in the child
    env["PYTHONPATH"] = str(ROOT / "tests" / "ops" / "blocked") + ":" + env["PYTHONPATH"]
    proc, ready = _serve(tmp_path, "--metrics-port", "0", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "kvtiers-core[metrics]" in err, err
    assert "Traceback" not in err and not ready.exists()
    done = run_kvtiers(["serve", "--help"],
                       env=child_env(), cwd=ROOT, timeout=60)
    assert done.returncode == 0 and "--metrics-port" in done.stdout


def test_the_ready_file_overwrites_no_file_of_the_users(tmp_path: Path) -> None:
    """`--ready-file PATH` writes PATH whole through a temporary of a fresh name: a
    file of the user's at `PATH.tmp` (the name it once used) stays as it was."""
    mine = tmp_path / "ready.json.tmp"
    data = os.urandom(333)
    mine.write_bytes(data)
    proc, ready = _serve(tmp_path)
    try:
        end = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < end, proc.stderr
            time.sleep(0.02)
        assert json.loads(ready.read_text())["endpoints"]
        assert mine.read_bytes() == data
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ready.json", "ready.json.tmp"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
