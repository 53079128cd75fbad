"""`kvtiers bench --metrics-port`: a real HTTP endpoint scraped while the bench
runs, parsed with prometheus_client's text parser; and without prometheus_client,
a clear error naming the extra while everything else works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kvtiers.metrics.defs import ALL_METRICS

from tests.bench.conftest import REPO, small_pool

HERE = Path(__file__).resolve().parent
RUN = ["--model", "tiny", "--prefixes", "4", "--prefix-tokens", "128", "--prompt-tokens",
       "32", "--output-tokens", "32", "--turns", "3", "--sessions-in-flight", "4",
       "--no-progress"]


def _env(block_prometheus: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO / "kvtiers-core" / "src"), str(REPO / "kvtiers-fs" / "src")]
    if block_prometheus:
        paths.insert(0, str(HERE / "blocked"))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def _samples(text: str) -> tuple[dict[str, str], dict[tuple[str, tuple[Any, ...]], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    types, values = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, values


def test_the_endpoint_is_scraped_during_a_run(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    root = tmp_path / "fs"
    root.mkdir()
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": small_pool(), "secondary_tiers": [
        {"type": "fs", "root_dir": str(root), "capacity_bytes": 64 << 20}]}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtiers", "bench", "--config", str(config), *RUN,
         "--duration", "60", "--metrics-port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed before the first run starts
        assert line.startswith("metrics: http://127.0.0.1:"), line
        url = line.split()[1]
        deadline = time.monotonic() + 120
        while True:  # until the run has promoted from fs (the machine may be slow)
            assert proc.poll() is None, "the bench ended before the scrape saw fs traffic"
            text = urllib.request.urlopen(url, timeout=30).read().decode()
            types, values = _samples(text)
            fs = (("tier", "fs"),)
            if values.get(("kvtiers_tier_promoted_blocks_total", fs), 0) > 0 and values.get(
                    ("kvtiers_tier_job_seconds_count", (("kind", "load"), *fs)), 0) > 0:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.5)
        assert proc.poll() is None  # scraped during the run
        for d in ALL_METRICS:
            assert types[d.name.removesuffix("_total")] == d.kind, d.name
        assert values[("kvtiers_tier_written_bytes_total", fs)] > 0
        assert values[("kvtiers_tier_capacity_bytes", fs)] == 64 << 20
        assert values[("kvtiers_pool_slots", ())] > 0
        assert values[("kvtiers_manager_call_seconds_count", (("call", "lookup_prefix"),))] > 0
        assert values[("kvtiers_tier_lookups_total", (("result", "hit"), *fs))] > 0
    finally:
        proc.kill()
        proc.wait(30)


def test_without_prometheus_client_the_option_names_the_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvtiers", "bench", *RUN, "--metrics-port", "0"],
        capture_output=True, text=True, env=_env(block_prometheus=True), cwd=REPO, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "kvtiers-core[metrics]" in done.stderr and "prometheus_client" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_prometheus_client_everything_else_works(tmp_path: Path) -> None:
    code = (
        "import kvtiers.metrics.recorder as r, kvtiers.metrics.instrument\n"
        "import kvtiers.metrics.prometheus\n"
        "rec = r.MetricsRecorder(); rec.count('tier_lookup', tier='x', result='hit')\n"
        "assert dict(rec.counters('tier_lookup'))\n"
        "try:\n    kvtiers.metrics.prometheus.MetricsExporter(rec)\n"
        "except ImportError as e:\n    print('refused', e.extra)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(block_prometheus=True), cwd=REPO, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "refused metrics", done.stderr
    done = subprocess.run([sys.executable, "-m", "kvtiers", "bench", "--help"],
                          capture_output=True, text=True, env=_env(block_prometheus=True),
                          cwd=REPO, timeout=60)
    assert done.returncode == 0 and "--metrics-port" in done.stdout
