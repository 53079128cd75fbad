"""The embedding guide's worked example (examples/embedding/toy_engine.py) runs as a
user would run it: a scheduler process and a worker process over one shared pool,
twice on one fs root. Every reloaded block is checked against the bytes its tokens
make; the second run's hits come from the fs tier through promotions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "embedding" / "toy_engine.py"


def _run(config: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", str(config), *args],
        capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, json.loads(lines[-1]) if lines else {}, proc.stderr


def _config(tmp_path: Path, pool_blocks: int = 64) -> Path:
    root = tmp_path / "fs"
    root.mkdir()
    doc = json.loads((SCRIPT.parent / "config.json").read_text())
    doc["cpu_bytes_to_use"] = pool_blocks * 8192
    doc["secondary_tiers"][0]["root_dir"] = str(root)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return path


def test_two_runs_on_one_root_reload_every_block_right(tmp_path: Path) -> None:
    config = _config(tmp_path)
    rc, first, err = _run(config)
    assert rc == 0, err
    assert first["requests"] == 24 and first["bad_blocks"] == 0
    # Multi-turn prompts: most blocks were seen a turn before, and each hit was checked.
    assert first["hit_blocks"] > first["computed_blocks"] > 0
    assert first["verified_blocks"] == first["hit_blocks"]
    # The pool (64 blocks) is smaller than the workload: it evicted, and told us so.
    assert first["events"]["removed:cpu"] > 0
    assert first["events"]["stored:fs"] == first["tiers"]["fs"]["cascaded_blocks"] > 0

    rc, second, err = _run(config)
    assert rc == 0, err
    fs = second["tiers"]["fs"]
    # A fresh process with an empty pool: its hits were promoted from the fs tier.
    assert fs["promoted_hits"] > 0 and second["retried_lookups"] > 0
    assert second["hit_blocks"] > first["hit_blocks"]
    assert second["verified_blocks"] == second["hit_blocks"]
    assert second["bad_blocks"] == 0


def test_a_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [
        {"type": "fs", "root_dir": str(tmp_path / "missing"), "capacity_bytes": 1 << 20}]}))
    rc, _, err = _run(bad)
    assert rc == 2
    assert "$.secondary_tiers[0].root_dir" in err and "does not exist" in err


def test_the_embedding_api_is_reachable_from_the_top_level() -> None:
    code = (
        "import sys, kvtiers\n"
        "assert 'kvtiers.manager' not in sys.modules and 'torch' not in sys.modules\n"
        "from kvtiers import build_manager, load_config, CpuPool, TieringOffloadingManager\n"
        "from kvtiers import OffloadEvent, prefix_block_hashes, DeviceSwapper, KVLayout\n"
        "assert 'torch' not in sys.modules\n"
        "assert set(kvtiers.__all__) >= {'build_manager', 'CpuPool', 'DeviceSwapper'}\n"
        "try:\n    kvtiers.no_such_name\nexcept AttributeError as e:\n"
        "    assert 'no_such_name' in str(e)\nelse:\n    raise SystemExit('no error')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
