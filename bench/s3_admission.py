#!/usr/bin/env python3
"""Admission on the s3 tier: the same chat workload (`kvtiers bench`, same seed)
through a CPU pool cascading into the s3 tier on SeaweedFS (started here), once per
admission policy: what each writes to the object store (bytes, PUT-ed blocks) and
what it serves back (the tier's promoted hits, prompt tokens served from it, hit
rates), every loaded byte checked by `kvtiers bench`.

    .venv/bin/python bench/s3_admission.py                 # all vs second_touch
    .venv/bin/python bench/s3_admission.py --runs 3 --admissions all second_touch

The workload's shared prefixes and session histories come back; each session's last
turn never does: those are the blocks `second_touch` keeps out of the bucket.
Results: bench/results/s3_admission.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.s3.conftest import cli_env  # noqa: E402
from tests.s3.servers import start_server  # noqa: E402

RESULTS = REPO / "bench" / "results" / "s3_admission.json"
WORKLOAD = ["--model", "small", "--prefixes", "16", "--prefix-tokens", "256",
            "--prompt-tokens", "64", "--output-tokens", "64", "--turns", "3",
            "--sessions-in-flight", "8", "--sessions", "96", "--no-progress"]


def run_once(server: Any, admission: str, pool_bytes: int, seed: int,
             tmp: Path) -> dict[str, Any]:
    name = f"admission-{uuid.uuid4().hex[:8]}"
    config = {
        "cpu_bytes_to_use": pool_bytes,
        "secondary_tiers": [{
            "type": "s3", "url": f"s3://{server.bucket}/{name}", "capacity_bytes": 4 << 30,
            "storage_options": server.storage_options(), "admission": admission,
        }],
    }
    cfg, out = tmp / f"{name}.json", tmp / f"{name}-out.json"
    cfg.write_text(json.dumps(config))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kvtiers", "bench", "--config", str(cfg), *WORKLOAD,
             "--seed", str(seed), "--json", str(out)],
            capture_output=True, text=True, cwd=REPO, env=cli_env(tmp), timeout=900)
        if done.returncode != 0:
            raise RuntimeError(done.stdout + done.stderr)
        run = json.loads(out.read_text())["result"]
    finally:
        server.clear(name + "/")
    s3 = run["tiers"]["s3"]
    assert run["verified"]["mismatches"] == 0 and s3["errors"] == {}, (run["verified"], s3)
    prompt = run["prompt_tokens"]
    served = run["served_tokens"]
    return {
        "admission": admission,
        "bytes_written": s3["bytes_written"],
        "blocks_written": s3.get("cascaded_blocks"),
        "not_admitted": s3["cascades_not_admitted"],
        "dropped": s3["cascades_dropped"],
        "promoted_hits": s3["promoted_hits"],
        "bytes_read": s3["bytes_read"],
        "s3_hit_rate": s3.get("hit_rate"),
        "tokens_from_s3": served.get("s3", 0),
        "prompt_tokens": prompt,
        "recomputed_tokens": run["recomputed_tokens"],
        "served_share": 1 - run["recomputed_tokens"] / prompt if prompt else 0.0,
        "verified_blocks": run["verified"]["blocks"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'admission':<14}{'MB written':>12}{'blocks PUT':>12}{'refused':>9}{'dropped':>9}"
            f"{'promoted':>10}{'MB read':>10}{'s3 tokens':>11}{'prompt served':>15}")
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['admission']:<14}{r['bytes_written'] / 1e6:>12.1f}{r['blocks_written']:>12}"
            f"{r['not_admitted']:>9}{r['dropped']:>9}{r['promoted_hits']:>10}"
            f"{r['bytes_read'] / 1e6:>10.1f}"
            f"{r['tokens_from_s3']:>11}{r['served_share'] * 100:>14.1f}%")
    return "\n".join(lines)


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"admission": runs[0]["admission"]}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            vals = [r[key] for r in runs if r[key] is not None]
            out[key] = statistics.median(vals) if vals else None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admissions", nargs="+", default=["all", "second_touch"])
    parser.add_argument("--runs", type=int, default=3, help="seeds (each policy, same seeds)")
    parser.add_argument("--pool-mib", type=int, default=16, help="CPU pool (MiB)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtiers-s3-admission-") as tmp_dir:
        tmp = Path(tmp_dir)
        with start_server("seaweedfs", tmp / "server") as server:
            per: dict[str, list[dict[str, Any]]] = {a: [] for a in args.admissions}
            for seed in range(args.runs):
                for admission in args.admissions:
                    row = run_once(server, admission, args.pool_mib << 20, seed, tmp)
                    per[admission].append(row)
                    print(f"seed {seed} {admission}: {row['bytes_written'] / 1e6:.1f} MB "
                          f"written, {row['promoted_hits']} promoted", flush=True)
    rows = [median_row(per[a]) for a in args.admissions]
    print("\nmedian over seeds:\n" + table(rows))
    doc = {"machine": {"node": platform.node(), "cpus": os.cpu_count(),
                       "python": platform.python_version()},
           "workload": WORKLOAD, "pool_bytes": args.pool_mib << 20, "runs": per,
           "median": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
