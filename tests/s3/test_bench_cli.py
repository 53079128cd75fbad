"""`kvtiers bench --config` with the CPU pool cascading into the s3 tier on a real
object store (SeaweedFS): end to end, every loaded byte checked."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from tests.bench.conftest import TINY, small_pool
from tests.clirun import run_kvtiers
from tests.s3.conftest import REPO, cli_env
from tests.s3.servers import S3Server


def test_bench_runs_a_cpu_pool_over_s3_and_checks_every_byte(
        tmp_path: Path, seaweedfs: S3Server) -> None:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    config = {
        "cpu_bytes_to_use": small_pool(),
        "secondary_tiers": [{
            "type": "s3", "url": f"s3://{seaweedfs.bucket}/{name}",
            "capacity_bytes": 64 << 20, "storage_options": seaweedfs.storage_options(),
        }],
    }
    (tmp_path / "c.json").write_text(json.dumps(config))
    out = tmp_path / "out.json"
    try:
        done = run_kvtiers(["bench", "--config", str(tmp_path / "c.json"), *TINY,
                            "--json", str(out)], cwd=REPO, env=cli_env(tmp_path), timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "every byte checked" in done.stdout and "all match" in done.stdout
        doc = json.loads(out.read_text())
        run = doc["result"]
        s3 = run["tiers"]["s3"]
        assert s3["bytes_written"] > 0 and s3["promoted_hits"] > 0 and s3["bytes_read"] > 0
        assert s3["errors"] == {}
        assert run["verified"]["blocks"] > 0 and run["verified"]["mismatches"] == 0
        text = out.read_text() + done.stdout + done.stderr
        assert seaweedfs.admin.secret not in text and seaweedfs.admin.key not in text
    finally:
        seaweedfs.clear(name + "/")
