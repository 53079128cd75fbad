"""The runs of bench/s3_bench.py over one server: every client and layout per block
size and concurrency, in an order that rotates from run to run, one row per
(block size, client, layout, concurrency, operation) with the MB/s of each run
and the latency of every request over all runs (the tier's rows: of each job too)."""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import uuid
from collections.abc import Callable
from typing import Any

from bench.s3.clients import Boto3Threads, S3fsAsync, Timed, delete_all
from bench.s3.nixl import nixl_pass
from bench.s3.passes import blocks as make_blocks
from bench.s3.passes import per_block_pass, raw_pass, segment_pass
from bench.s3.report import KiB, MiB, pct
from bench.s3.tier import tier_pass
from tests.s3.servers import S3Server

__all__ = ["bench_server"]


def bench_server(server: S3Server, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}

    def record(bb: int, client: str, layout: str, conc: int, n: int,
               result: dict[str, Timed], per_job: dict[str, list[float]]) -> None:
        for op, (secs, lat) in result.items():
            row = rows.setdefault((bb, client, layout, conc, op), {
                "server": server.kind, "block_bytes": bb, "client": client, "layout": layout,
                "concurrency": conc, "op": op, "blocks": n, "mb_s_runs": [], "requests": 0,
                "lat_ms": [], "job_lat_ms": []})
            row["mb_s_runs"].append(n * bb / secs / 1e6)
            row["requests"] = len(lat)
            row["lat_ms"] += [x * 1e3 for x in lat]
            row["job_lat_ms"] += [x * 1e3 for x in per_job.pop(op, [])]

    for run in range(args.runs):
        for bb in args.block_sizes:
            n = max(4, min(args.max_blocks, args.pass_bytes // bb))
            for conc in args.concurrency:
                boto, s3fs_ = Boto3Threads(server, conc), S3fsAsync(server, conc)
                unsigned = Boto3Threads(server, conc, unsigned=True)
                objs = S3fsAsync(server, conc, objectstore=True)
                objb = S3fsAsync(server, conc, objectstore=True, boto3=True)
                try:
                    blocks = functools.partial(make_blocks, n, bb)
                    per_job: dict[str, list[float]] = {}  # the tier's, until recorded
                    cases: list[tuple[str, str, Callable[[str], dict[str, Timed]]]] = [
                        ("boto3-threads", "raw", functools.partial(raw_pass, boto, blocks)),
                        (unsigned.name, "raw", functools.partial(raw_pass, unsigned, blocks)),
                        ("s3fs-async", "raw", functools.partial(raw_pass, s3fs_, blocks)),
                        ("objectstore", "raw", functools.partial(raw_pass, objs, blocks)),
                        ("objectstore-boto3", "raw", functools.partial(raw_pass, objb, blocks)),
                        ("objectstore", "per-block",
                         functools.partial(per_block_pass, objs, blocks)),
                    ]
                    cases += [("objectstore", f"segments-{seg}MiB", functools.partial(
                        segment_pass, objs, blocks, segment_bytes=seg * MiB,
                        job_blocks=args.job_blocks)) for seg in args.segment_mib]
                    if args.nixl:
                        cases.append(("nixl-obj (vLLM)", "per-block", functools.partial(
                            nixl_pass, server, n, bb, threads=conc, job_blocks=args.job_blocks,
                            nixl_path=args.nixl_path)))
                    # the tier itself: the same blocks, from a pool, in jobs; latency
                    # per request (each PUT and GET it made), and per job
                    cases += [(f"s3-tier/{client}", f"tier-{packing}", functools.partial(
                        tier_pass, server, blocks, concurrency=conc, per_job=per_job,
                        job_blocks=args.job_blocks, packing=packing, client=client))
                        for packing, client in (("per_block", "boto3"),
                                                ("per_block", "aiobotocore"),
                                                ("segments", "boto3"))]
                    # rotate the order from run to run: what ran just before matters
                    shift = run % len(cases)
                    for client, layout, fn in cases[shift:] + cases[:shift]:
                        prefix = f"bench-{uuid.uuid4().hex[:8]}"
                        record(bb, client, layout, conc, n, fn(prefix), per_job)
                        delete_all(server, prefix + "/")
                finally:
                    boto.close()
                    unsigned.close()
                    s3fs_.close()
                    objs.close()
                    objb.close()
            print(f"  {server.kind}: run {run + 1}/{args.runs}, {bb // KiB} KiB blocks done",
                  file=sys.stderr)
    out = []
    for row in rows.values():
        lat, jobs = row.pop("lat_ms"), row.pop("job_lat_ms")
        row["mb_s"] = statistics.median(row["mb_s_runs"])
        row["p50_ms"], row["p99_ms"] = pct(lat, 0.5), pct(lat, 0.99)
        if jobs:  # the tier's rows: each job too (submit to result)
            row["job_p50_ms"], row["job_p99_ms"] = pct(jobs, 0.5), pct(jobs, 0.99)
        out.append(row)
    return out
