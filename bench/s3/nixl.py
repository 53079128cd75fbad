"""vLLM's obj tier's data path (NIXL's OBJ backend, bench/nixl_obj_bench.py) as a
pass, in its own process, where nixl_cu12 can be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.s3.clients import Timed
from tests.s3.servers import S3Server

__all__ = ["nixl_available", "nixl_pass"]

REPO = Path(__file__).resolve().parents[2]


def nixl_pass(server: S3Server, n: int, bb: int, prefix: str, *, threads: int,
              job_blocks: int, nixl_path: str) -> dict[str, Timed]:
    """vLLM's obj tier's data path (bench/nixl_obj_bench.py), in its own process."""
    cfg = {"endpoint": server.endpoint_url.removeprefix("http://"), "bucket": server.bucket,
           "key": server.admin.key, "secret": server.admin.secret, "prefix": prefix,
           "block_bytes": bb, "blocks": n, "job_blocks": job_blocks, "threads": threads}
    env = {**os.environ, **({"PYTHONPATH": nixl_path} if nixl_path else {}),
           "NIXL_LOG_LEVEL": "WARN"}
    done = subprocess.run([sys.executable, str(REPO / "bench" / "nixl_obj_bench.py"),
                           json.dumps(cfg)], capture_output=True, text=True, env=env,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"nixl_obj_bench failed: {done.stderr[-2000:]}")
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["match"], "NIXL read back other bytes"
    return {"store": (doc["store"][0], doc["store"][1]), "load": (doc["load"][0], doc["load"][1])}


def nixl_available(nixl_path: str | None) -> bool:
    """nixl_cu12 imports from `nixl_path`, or (empty) from this Python's own path."""
    if nixl_path is None:
        return False
    env = {**os.environ, **({"PYTHONPATH": nixl_path} if nixl_path else {})}
    done = subprocess.run([sys.executable, "-c", "import nixl_cu12, numpy"], env=env,
                          capture_output=True, timeout=120)
    return done.returncode == 0
