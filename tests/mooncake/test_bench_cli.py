"""`kvtiers bench --config` with the CPU pool cascading into the mooncake tier on a
real master (in the test's namespace): end to end, every loaded byte checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.bench.conftest import TINY, small_pool
from tests.mooncake.master import Master
from tests.mooncake.netns import NetNamespace

REPO = Path(__file__).resolve().parents[2]


def test_bench_runs_a_cpu_pool_over_mooncake_and_checks_every_byte(
        tmp_path: Path, ns: NetNamespace, master: Master) -> None:
    config = {
        "cpu_bytes_to_use": small_pool(),
        "secondary_tiers": [{"type": "mooncake", "master_address": master.address,
                             "capacity_bytes": 64 << 20, "prefix": "bench"}],
    }
    (tmp_path / "c.json").write_text(json.dumps(config))
    out = tmp_path / "out.json"
    done = subprocess.run(
        ns.command(sys.executable, "-m", "kvtiers", "bench", "--config",
                   str(tmp_path / "c.json"), *TINY, "--json", str(out), "--no-progress"),
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "every byte checked" in done.stdout and "all match" in done.stdout
    run = json.loads(out.read_text())["result"]
    tier = run["tiers"]["mooncake"]
    assert tier["bytes_written"] > 0 and tier["promoted_hits"] > 0 and tier["bytes_read"] > 0
    assert tier["errors"] == {}
    assert run["verified"]["blocks"] > 0 and run["verified"]["mismatches"] == 0
    # (the bench's objects lived in its own segment: gone with its process)
    assert not any(n.startswith("bench/") for n in master.names())
