#!/usr/bin/env python3
"""kvtiers-s3 benchmark: raw S3 clients and the two object layouts against a real
object store on loopback (SeaweedFS, started here), all in the same run.

    .venv/bin/python bench/s3_bench.py                 # 5 runs, 2 MiB and 64 KiB blocks
    .venv/bin/python bench/s3_bench.py --quick         # smaller, for a smoke run
    .venv/bin/python bench/s3_bench.py --servers seaweedfs rclone moto

Rows (MB/s = 10^6 bytes/s of block bytes; median of --runs runs; every pass writes
new objects and every loaded byte is compared with what was stored):

- raw boto3-threads: boto3 with a thread pool (--concurrency threads, one client, as
  many pooled connections), put_object / get_object, one object per block;
- raw s3fs-async: s3fs on one event loop, `_pipe_file` / `_cat_file` per block under
  asyncio.gather with a semaphore of --concurrency, one object per block;
- raw objectstore: `kvtiers_s3.client.objects.ObjectStore` (the tier's data layer: s3fs'
  aiobotocore client called directly), same pattern; objectstore-boto3: the same
  layer with boto3 on a thread pool (`client: "boto3"`);
- per-block (objectstore): kvtiers-s3's block records (header + block,
  `kvtiers_s3.layout.codec`), header checked and checksum verified on load;
- nixl-obj (vLLM): vLLM's obj tier's data path, NIXL's OBJ backend as vLLM 0.33
  drives it (one transfer per job, num_threads = --concurrency), in its own
  process (bench/nixl_obj_bench.py; --nixl-path);
- segments-<N>MiB (objectstore): the blocks of each job of --job-blocks blocks
  packed into segments of up to N MiB (`segment.plan_segments`), one PUT each;
  loaded with one ranged GET per block ("load-ranged": a load of scattered
  blocks) and with the job's records coalesced into as few ranged GETs as they
  allow ("load-coalesced", `kvtiers_s3.jobs.ranges`: a prefix loaded as it was stored).

Per-request latency (p50/p99 ms) is recorded for every pass. The tier's rows
(`s3-tier/<client>`, `bench/s3/tier.py`) store the same blocks from a pool in
jobs of --job-blocks, all submitted at once, and load them back; their latency is
per job (submit to result). Then: start-up of a tier over a bucket holding
--startup-blocks blocks (4 KiB, both layouts, median of 3 starts), and an outage
(kill -9 of the server, restart): how long loads take to fail, and how long after
the server is back the first load succeeds. Results: bench/results/s3_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
for _dist in ("kvtiers-core", "kvtiers-s3"):
    sys.path.insert(0, str(REPO / _dist / "src"))

from bench.s3.driver import bench_server  # noqa: E402
from bench.s3.nixl import nixl_available  # noqa: E402
from bench.s3.report import KiB, MiB, table  # noqa: E402
from bench.s3.tier import outage_bench, startup_bench  # noqa: E402
from tests.s3.servers import make_server  # noqa: E402

RESULTS = REPO / "bench" / "results" / "s3_bench.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--servers", nargs="+", default=["seaweedfs"],
                        choices=["seaweedfs", "rclone", "moto"])
    parser.add_argument("--block-sizes", nargs="+", type=int, default=[2 * MiB, 64 * KiB])
    parser.add_argument("--pass-bytes", type=int, default=96 * MiB,
                        help="bytes of blocks per pass (each pass writes new objects)")
    parser.add_argument("--max-blocks", type=int, default=512,
                        help="at most this many blocks per pass")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--segment-mib", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--job-blocks", type=int, default=256,
                        help="blocks per store job: segments are packed within a job")
    parser.add_argument("--startup-blocks", type=int, default=100_000,
                        help="blocks in the bucket for the start-up measurement (0: skip)")
    parser.add_argument("--no-outage", dest="outage", action="store_false",
                        help="skip the outage measurement")
    parser.add_argument("--nixl-path", default=os.environ.get("KVTIERS_NIXL_PATH"),
                        help="a directory with nixl_cu12 (pip install --target DIR "
                        "nixl-cu12 numpy): adds vLLM's obj tier's data path (NIXL OBJ)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="1 run, 16 MiB passes")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.pass_bytes, args.concurrency, args.segment_mib = 1, 16 * MiB, [16], [8]
        args.startup_blocks = min(args.startup_blocks, 2000)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on kill
    args.nixl = nixl_available(args.nixl_path)
    if not args.nixl:
        print("  vLLM's obj tier (NIXL OBJ): not run - nixl_cu12 not importable "
              "(--nixl-path)", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    startups: list[dict[str, Any]] = []
    outages: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvtiers-s3-bench-") as tmp:
        for kind in args.servers:
            server = make_server(kind, Path(tmp) / kind)
            try:
                server.start()
                if args.runs:
                    rows += bench_server(server, args)
                if args.startup_blocks:
                    for packing in ("per_block", "segments"):
                        startups.append({"server": kind, **startup_bench(
                            server, f"startup-{packing}", blocks=args.startup_blocks,
                            block_bytes=4096, packing=packing, runs=3)})
                        print(f"  {kind}: start-up over {args.startup_blocks} blocks "
                              f"({packing}) done", file=sys.stderr)
            finally:
                server.stop()
            if args.outage:
                outages.append(outage_bench(kind, Path(tmp) / f"{kind}-outage"))
    print(table(rows))
    for s in startups:
        print(f"start-up  {s['server']:<10} {s['packing']:<10} {s['blocks']} blocks in "
              f"{s['objects']} objects: tier ready in {s['start_s']:.2f} s (listing "
              f"{s['listing_s']:.2f} s; median of {len(s['start_s_runs'])})")
    for o in outages:
        print(f"outage    {o['server']:<10} loads failed {o['loads_fail_after_s']:.2f} s after "
              f"the kill; server back in {o['server_restart_s']:.2f} s; first good load "
              f"{o['first_good_load_after_back_s']:.2f} s after that")
    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"host": platform.node(), "kernel": platform.release(),
                    "python": platform.python_version(), "cpus": os.cpu_count()},
        "runs": args.runs, "pass_bytes": args.pass_bytes, "units": "MB/s = 10^6 B/s of "
        "block bytes, median of runs; latency per request over all runs",
        "nixl": "run" if args.nixl else "not run: nixl_cu12 not importable",
        "rows": rows,
        "startup": startups,
        "outage": outages,
    }
    if not args.quick or args.json != RESULTS:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
