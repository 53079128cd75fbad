"""`kvtiers bench` as a user runs it: a subprocess, its exit status, its output and
its JSON. Tiny geometry and workload: each run takes a couple of seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, TINY, kvtiers, small_pool, write_config


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_json_has_per_tier_hits_misses_bytes_and_throughput(tmp_path: Path,
                                                             ram_dir: Path) -> None:
    root = ram_dir  # fs hits wanted: see `ram_dir`
    config = write_config(
        tmp_path / "c.json",
        {
            "cpu_bytes_to_use": small_pool(),
            "secondary_tiers": [{"type": "fs", "root_dir": str(root), "capacity_bytes": 64 << 20}],
        },
    )
    out, plot = tmp_path / "out.json", tmp_path / "out.png"
    done = kvtiers("bench", "--config", config, *TINY, "--json", str(out), "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert "every byte checked" in done.stdout and "all match" in done.stdout
    doc = _load(out)
    run = doc["result"]
    tiers = run["tiers"]
    assert list(tiers) == ["cpu", "fs"]
    for name, t in tiers.items():
        for key in (
            "hits",
            "misses",
            "bytes_read",
            "bytes_written",
            "read_gbps",
            "write_gbps",
            "hit_rate",
            "tokens_served",
            "evictions",
            "cascades_dropped",
            "errors",
        ):
            assert key in t, (name, key)
    cpu, fs = tiers["cpu"], tiers["fs"]
    assert cpu["hits"] > 0 and cpu["evictions"] > 0 and cpu["bytes_written"] > 0
    assert fs["bytes_written"] > 0 and fs["write_gbps"] > 0  # cascades reached fs
    assert fs["promoted_hits"] > 0 and fs["bytes_read"] > 0 and fs["read_gbps"] > 0
    assert fs["tokens_served"] > 0 and fs["errors"] == {}
    # Every prompt token is accounted for: served from a tier or recomputed.
    assert sum(run["served_tokens"].values()) + run["recomputed_tokens"] == run["prompt_tokens"]
    assert run["requests"] == 24 * 3
    assert run["verified"]["blocks"] > 0 and run["verified"]["mismatches"] == 0
    paths = {(t["tier"], t["direction"]) for t in run["transfers"]}
    assert paths == {("gpu", "store"), ("gpu", "load"), ("fs", "write"), ("fs", "read")}
    for key in ("lookup_prefix", "prepare_store"):
        assert run["latency"][key]["n"] > 0 and run["latency"][key]["p99_us"] > 0
    assert run["timeseries"] and doc["geometry"]["block_bytes"] == 8192
    assert doc["config"]["cpu_bytes_to_use"] == small_pool()
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_config_runs_and_removes_its_directory(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = kvtiers("bench", *TINY, "--tmp-dir", str(tmp_path), "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "built-in default" in done.stdout and "fs (promoted)" in done.stdout
    doc = _load(out)
    assert [t["type"] for t in doc["config"]["secondary_tiers"]] == ["fs"]
    assert doc["result"]["tiers"]["fs"]["bytes_written"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # temp dir removed


def _faulty(tmp_path: Path, detected: bool) -> str:
    return write_config(
        tmp_path / "faulty.json",
        {
            "cpu_bytes_to_use": small_pool(),
            "secondary_tiers": [
                {
                    "type": "faulty",
                    "seed": 3,
                    "corrupt_rate": 0.3,
                    "corrupt_detected": detected,
                    "inner": {"type": "memory", "capacity_bytes": 64 << 20},
                }
            ],
        },
    )


def test_corruption_behind_a_tiers_back_becomes_misses_counted_as_corrupt(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = kvtiers("bench", "--config", _faulty(tmp_path, True), *TINY, "--json", str(out))
    assert done.returncode == 0, done.stderr
    run = _load(out)["result"]
    faulty = run["tiers"]["faulty"]
    assert faulty["errors"].get("corrupt", 0) > 0
    assert faulty["promotion_failures"] == faulty["errors"]["corrupt"]
    assert faulty["tokens_served"] > 0  # the intact ones were served...
    assert run["verified"]["blocks"] > 0 and run["verified"]["mismatches"] == 0  # ...and checked
    assert "corrupt: " in done.stdout


def test_copies_a_tier_finishes_after_the_last_request_are_counted_and_said(
        tmp_path: Path) -> None:
    """A tier slower than the run (every store held 1.5 s): the report says how long
    the wait for its last copies took, and the JSON counts them."""
    lagging = {"type": "faulty", "latency_s": 1.5, "ops": ["store"],
               "inner": {"type": "memory", "capacity_bytes": 64 << 20}}
    config = write_config(tmp_path / "c.json",
                          {"cpu_bytes_to_use": small_pool(), "secondary_tiers": [lagging]})
    out = tmp_path / "out.json"
    done = kvtiers("bench", "--config", config, *TINY, "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "after the last request the tiers took" in done.stdout
    run = _load(out)["result"]
    assert run["settle"]["finished"] and run["settle"]["seconds"] > 0.5
    faulty = run["tiers"]["faulty"]
    assert faulty["bytes_written"] == faulty["cascaded_blocks"] * 8192 > 0


def test_wrong_bytes_reaching_the_gpu_fail_the_run(tmp_path: Path) -> None:
    # corrupt_detected: false -> the faulty tier reports the flipped blocks as good.
    out = tmp_path / "out.json"
    done = kvtiers("bench", "--config", _faulty(tmp_path, False), *TINY, "--json", str(out))
    assert done.returncode == 1, (done.stdout, done.stderr)
    err = done.stderr
    assert err.startswith("kvtiers bench FAILED: wrong bytes reached the GPU: block ")
    assert "promoted into the pool from tier 'faulty'" in err
    assert "Traceback" not in err
    assert not out.exists()  # no results for an invalid run


def test_config_larger_than_the_machine_is_refused(tmp_path: Path) -> None:
    # The vLLM PR #46216 stress run's config: 400 GiB of CPU memory.
    config = write_config(
        tmp_path / "pr46216.json",
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": 400 << 30,
                "secondary_tiers": [
                    {"type": "fs", "root_dir": str(tmp_path), "capacity_bytes": 2 * 10**12},
                ],
            },
        },
    )
    done = kvtiers("bench", "--config", config, *TINY)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == "kvtiers bench: the config is refused; nothing is shrunk to fit"
    assert lines[1].startswith(
        "error: $.kv_connector_extra_config.cpu_bytes_to_use: 400 GiB (429496729600 bytes) "
        "is more than this machine's physical memory"
    )
    assert "Traceback" not in done.stderr


def test_a_stand_in_gpu_larger_than_memory_is_refused(tmp_path: Path) -> None:
    done = kvtiers("bench", *TINY, "--tmp-dir", str(tmp_path), "--gpu-pages", str(10**8))
    assert done.returncode == 2
    # The CPU stand-in is checked against the host's memory, CUDA memory against the GPU's.
    assert "error: this run needs " in done.stderr or "error: the GPU KV cache needs" in done.stderr
    assert "nothing is shrunk to fit" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("layout", ["cross"])
def test_compare_runs_three_stacks_side_by_side(tmp_path: Path, layout: str) -> None:
    out = tmp_path / "out.json"
    config = write_config(
        tmp_path / "c.json",
        {
            "cpu_bytes_to_use": small_pool(),
            "secondary_tiers": [{"type": "memory", "capacity_bytes": 64 << 20}],
        },
    )
    done = kvtiers(
        "bench",
        "--config",
        config,
        *TINY,
        "--compare",
        "--kv-layout",
        layout,
        "--prefill-us-per-token",
        "50",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert "prefill cost per recomputed token: 50.0 us (given: 50 us per token" in done.stdout
    doc = _load(out)
    labels = [r["label"] for r in doc["compare"]]
    assert labels == ["no offloading", "CPU pool only", "configured stack"]
    rows = doc["compare_rows"]
    none, cpu_only, full = rows["recomputed tokens"]
    assert none == doc["compare"][0]["prompt_tokens"]  # nothing offloaded: all recomputed
    # Both offload; which recomputes less depends on the pool (promotions evict too).
    assert none > cpu_only and none > full
    assert rows["served from secondary tiers"][2] > 0 == rows["served from secondary tiers"][1]
    saved = rows["prefill saved vs no offloading (s)"]
    assert saved[0] == 0 and saved[2] == pytest.approx((none - full) * 50e-6)


def _kvtiers_env(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvtiers", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, **env},
    )


def test_output_destinations_are_checked_before_the_run(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = {
        ("--json", str(a_file / "out.json")):
            f"error: --json {a_file}/out.json: {str(a_file)!r} is a file, so no directory "
            "can be made there",
        ("--json", str(tmp_path)):
            f"error: --json {tmp_path}: is a directory; give a file name in it",
        ("--plot", str(tmp_path / "out.txt")):
            f"error: --plot {tmp_path}/out.txt: '.txt' is not an image format; matplotlib writes ",
        ("--plot", str(tmp_path / "deep" / "dir" / "out.png"), "--model-check"):
            "error: --plot draws a bench run over time; --model-check has none",
    }
    for args, start in cases.items():
        done = kvtiers("bench", *TINY, "--tmp-dir", str(tmp_path), *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stdout == ""  # refused before the run printed its header
        assert done.stderr.startswith(start), done.stderr
        assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing created


def test_plot_without_matplotlib_is_refused_before_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "no-matplotlib" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    path = os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")])
    done = _kvtiers_env("bench", *TINY, "--plot", str(tmp_path / "p.png"), PYTHONPATH=path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "error: --plot needs matplotlib, which is not installed here: install kvtiers-core's "
        "`plot` extra (`pip install './kvtiers-core[plot]'` in a checkout of the kvtiers "
        "repository, or `pip install matplotlib`), or leave --plot out\n"
    )


def test_core_alone_says_which_distribution_provides_the_fs_tier(tmp_path: Path) -> None:
    hint = (
        "install kvtiers-fs to use type 'fs' (not published yet: `pip install ./kvtiers-fs` in "
        "a checkout of the kvtiers repository, after kvtiers-core)"
    )
    alone = {"KVTIERS_PLUGINS_ALLOW": "none-at-all"}  # the core's built-ins only
    done = _kvtiers_env("bench", *TINY, "--tmp-dir", str(tmp_path), **alone)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(
        "error: without --config, kvtiers bench runs a CPU pool and an fs tier, and no fs tier "
        f"is installed (kvtiers-core alone has the memory and faulty tiers): {hint}; or pass "
        "--config with the tiers you have"
    )
    check = _kvtiers_env("bench", "--model-check", "--tmp-dir", str(tmp_path), **alone)
    assert check.returncode == 2 and check.stdout == ""
    assert check.stderr.startswith(
        "error: --model-check reloads the model's KV from an fs tier (its third run), and no "
        f"fs tier is installed (kvtiers-core alone has the memory and faulty tiers): {hint}"
    )
    assert list(tmp_path.iterdir()) == []
