#!/usr/bin/env python3
"""The s3 tier's stores and loads against the raw clients and vLLM's obj tier's
data path, interleaved, on one SeaweedFS (started here): the same blocks, the same
concurrency, rounds whose order rotates, medians per row, and each row's share of
the best raw client and of NIXL in each round (the ratio is taken within the round,
then its median: rounds differ on a shared machine, a ratio in one round does not).

    .venv/bin/python bench/s3_store_ab.py --rounds 21 --copied-body     # 2 MiB
    .venv/bin/python bench/s3_store_ab.py --block-bytes 65536 --pass-bytes 16777216

Rows: raw boto3 with threads (as configured by default, and with the tier's
unsigned request bodies), raw s3fs async, raw `ObjectStore` (aiobotocore and
boto3); `nixl-obj-vllm`: vLLM's obj tier's data path, NIXL's OBJ backend driven as
vLLM 0.33 does (bench/nixl_obj_bench.py, its own process; nixl-cu12 importable,
else --nixl-path or --no-nixl); the tier per-block (boto3) and with its default
layout (`auto`); with --copied-body the same two with the store path before
session 6 (each object's parts copied into one buffer, then PUT); --layouts adds
tier rows of other layout options.
"of best raw": the share of the raw client with the highest median, per round,
then the median; "of nixl": of NIXL in the same round; "of max/round": of the
fastest raw result of each round (biased towards the raw side). Tier jobs of
--job-blocks are submitted at once; p50/p99 are per request (each PUT and GET, the
tier's own timing; NIXL's: per job), "job" per job (submit to result); "cpu c/s":
CPU ms per MB moved in the timed section, of this process (the client, all its
threads) and of the server process.
Results: bench/results/s3_store_ab_<block>.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
for _dist in ("kvtiers-core", "kvtiers-s3"):
    sys.path.insert(0, str(REPO / _dist / "src"))

from bench.s3.clients import Boto3Threads, CpuClock, S3fsAsync, Timed, delete_all  # noqa: E402
from bench.s3.nixl import nixl_available, nixl_pass  # noqa: E402
from bench.s3.passes import blocks as make_blocks  # noqa: E402
from bench.s3.passes import raw_pass  # noqa: E402
from bench.s3.report import pct  # noqa: E402
from bench.s3.tier import tier_pass  # noqa: E402
from tests.s3.servers import start_server  # noqa: E402

NIXL = "nixl-obj-vllm"  # vLLM's obj tier's data path: NIXL's OBJ backend (C++)
RAW = ("boto3-threads", "boto3-threads-unsigned", "s3fs-async", "objectstore",
       "objectstore-boto3")


def shares(rounds: list[dict[tuple[str, str], float]],
           mbs: dict[tuple[str, str], list[float]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (client, op): its share of the best raw client - the raw client with the
    highest median for that op - taken within each round, then the median of the
    rounds; and (as before) its share of the fastest raw result of each round,
    which favours the raw side: the largest of five noisy results beats a typical
    one even when all five clients are equally fast."""
    best = {op: max((raw for raw in RAW if (raw, op) in mbs),
                    key=lambda raw: statistics.median(mbs[(raw, op)]))
            for _, op in mbs}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for (name, op) in mbs:
        of_best = [r[(name, op)] / r[(best[op], op)] for r in rounds]
        of_max = [r[(name, op)] / max(r[(raw, op)] for raw in RAW if (raw, op) in r)
                  for r in rounds]
        out[(name, op)] = {"best_raw": best[op], "share_of_best_raw": statistics.median(of_best),
                           "share_of_best_raw_runs": of_best,
                           "share_of_max_raw_per_round": statistics.median(of_max)}
        if (NIXL, op) in mbs:  # vLLM's obj tier, in the same round
            of_nixl = [r[(name, op)] / r[(NIXL, op)] for r in rounds]
            out[(name, op)] |= {"share_of_nixl": statistics.median(of_nixl),
                                "share_of_nixl_runs": of_nixl}
    return out



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-bytes", type=int, default=2 << 20)
    parser.add_argument("--pass-bytes", type=int, default=64 << 20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--job-blocks", type=int, default=256)
    parser.add_argument("--layouts", nargs="*", default=[], metavar="JSON",
                        help='more tier rows, each with these layout options, such as '
                        '\'{"packing": "segments", "segment_bytes": 8388608}\'')
    parser.add_argument("--nixl-path", default=os.environ.get("KVTIERS_NIXL_PATH", ""),
                        help="where nixl_cu12 is, if not importable from this Python "
                        "(pip install --target DIR --no-deps nixl-cu12)")
    parser.add_argument("--no-nixl", action="store_true",
                        help="leave out the row of vLLM's obj tier's data path (NIXL OBJ)")
    parser.add_argument("--raw", nargs="*", default=list(RAW), choices=RAW, metavar="NAME",
                        help=f"the raw clients measured (default: all of {', '.join(RAW)})")
    parser.add_argument("--copied-body", action="store_true",
                        help="also the tier rows with the old store path: each object's "
                        "parts copied into one buffer, then PUT")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    bb, conc = args.block_bytes, args.concurrency
    n = max(4, args.pass_bytes // bb)
    mbs: dict[tuple[str, str], list[float]] = {}
    lat: dict[tuple[str, str], list[float]] = {}
    per_job: dict[str, list[float]] = {}
    job_lat: dict[tuple[str, str], list[float]] = {}
    rounds: list[dict[tuple[str, str], float]] = []
    cpu_ms: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="kvtiers-s3-ab-") as tmp, \
            start_server("seaweedfs", Path(tmp) / "server") as server:
        make_client: dict[str, Callable[[], Any]] = {
            "boto3-threads": lambda: Boto3Threads(server, conc),
            "boto3-threads-unsigned": lambda: Boto3Threads(server, conc, unsigned=True),
            "s3fs-async": lambda: S3fsAsync(server, conc),
            "objectstore": lambda: S3fsAsync(server, conc, objectstore=True),
            "objectstore-boto3": lambda: S3fsAsync(server, conc, objectstore=True, boto3=True)}
        clients: dict[str, Any] = {name: make_client[name]() for name in args.raw}
        payloads: list[bytes] = []  # new random bytes each round, shared by its passes

        def blocks() -> list[tuple[bytes, bytes]]:
            return [(os.urandom(36), p) for p in payloads]  # new keys: new objects
        clock = CpuClock(server)
        cases: list[tuple[str, Callable[[str], dict[str, Timed]]]] = [
            (name, functools.partial(raw_pass, c, blocks, cpu=clock))
            for name, c in clients.items()]
        cases += [(f"tier-{packing}", functools.partial(
            tier_pass, server, blocks, concurrency=conc, job_blocks=args.job_blocks,
            packing=packing, client="boto3", per_job=per_job, cpu=clock))
            for packing in ("per_block", "auto")]
        if args.copied_body:  # the store path before session 6, same run
            cases += [(f"tier-{packing}-copied-body", functools.partial(
                tier_pass, server, blocks, concurrency=conc, job_blocks=args.job_blocks,
                packing=packing, client="boto3", per_job=per_job, copied_body=True,
                cpu=clock))
                for packing in ("per_block", "auto")]
        if not args.no_nixl:
            if not nixl_available(args.nixl_path):
                raise SystemExit("nixl_cu12 cannot be imported (pip install nixl-cu12, or "
                                 "--nixl-path DIR, or --no-nixl)")
            cases.append((NIXL, functools.partial(
                nixl_pass, server, n, bb, threads=conc, job_blocks=args.job_blocks,
                nixl_path=args.nixl_path)))
        for text in args.layouts:
            layout = json.loads(text)
            cases.append((f"tier-{'-'.join(f'{k}={v}' for k, v in layout.items())}",
                          functools.partial(tier_pass, server, blocks, concurrency=conc,
                                            job_blocks=args.job_blocks, packing="auto",
                                            client="boto3", layout=layout,
                                            per_job=per_job, cpu=clock)))
        try:
            payloads[:] = [p for _, p in make_blocks(n, bb)]
            fn0 = cases[0][1]
            fn0(f"warm-{uuid.uuid4().hex[:8]}")  # connections, server caches
            for r in range(args.rounds):
                payloads[:] = [p for _, p in make_blocks(n, bb)]
                shift = r % len(cases)
                this: dict[tuple[str, str], float] = {}
                for name, fn in cases[shift:] + cases[:shift]:
                    prefix = f"ab-{uuid.uuid4().hex[:8]}"
                    clock.spent.clear()
                    for op, (secs, req) in fn(prefix).items():
                        this[(name, op)] = n * bb / secs / 1e6
                        if op in clock.spent:  # CPU ms per MB moved: client, server
                            for who, spent in zip(("client", "server"), clock.spent[op],
                                                  strict=True):
                                cpu_ms.setdefault((name, op, who), []).append(
                                    spent * 1e3 / (n * bb / 1e6))
                        mbs.setdefault((name, op), []).append(this[(name, op)])
                        lat.setdefault((name, op), []).extend(x * 1e3 for x in req)
                        job_lat.setdefault((name, op), []).extend(
                            x * 1e3 for x in per_job.pop(op, []))
                    delete_all(server, prefix + "/")
                rounds.append(this)
                print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            for c in clients.values():
                c.close()
    share = shares(rounds, mbs)
    rows: list[dict[str, Any]] = [
        {"client": name, "op": op, "mb_s": statistics.median(v), "mb_s_runs": v,
         **share[(name, op)],
         "p50_ms": pct(lat[(name, op)], 0.5), "p99_ms": pct(lat[(name, op)], 0.99),
         **({"job_p50_ms": pct(job_lat[(name, op)], 0.5),
             "job_p99_ms": pct(job_lat[(name, op)], 0.99)} if job_lat[(name, op)] else {}),
         **{f"{who}_cpu_ms_per_mb": statistics.median(cpu_ms[(name, op, who)])
            for who in ("client", "server") if (name, op, who) in cpu_ms}}
        for (name, op), v in sorted(mbs.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    print(f"{bb} B blocks, {n} a pass, concurrency {conc}, median of {args.rounds} rounds; "
          "latency per request (the tier's: also per job; NIXL's: per job); cpu c/s: CPU ms "
          "per MB moved, client / server process")
    print(f"{'op':<6} {'client':<30} {'MB/s':>7} {'of best raw':>12} {'of nixl':>8} "
          f"{'of max/round':>13} {'p50 ms':>8} {'p99 ms':>8} {'job p50':>8} {'job p99':>8} "
          f"{'cpu c/s':>11}")
    for row in rows:
        jobs = "".join(f" {row[k]:>8.1f}" if k in row else f" {'-':>8}"
                       for k in ("job_p50_ms", "job_p99_ms"))
        nixl = f"{row['share_of_nixl'] * 100:>7.0f}%" if "share_of_nixl" in row else f"{'-':>8}"
        cpu = (f"{row['client_cpu_ms_per_mb']:.2f}/{row['server_cpu_ms_per_mb']:.2f}"
               if "client_cpu_ms_per_mb" in row else "-")
        print(f"{row['op']:<6} {row['client']:<30} {row['mb_s']:>7.0f} "
              f"{row['share_of_best_raw'] * 100:>11.0f}% {nixl} "
              f"{row['share_of_max_raw_per_round'] * 100:>12.0f}% {row['p50_ms']:>8.1f} "
              f"{row['p99_ms']:>8.1f}{jobs} {cpu:>11}")
    for op in sorted({op for _, op in mbs}):
        print(f"best raw client for {op}: {share[(args.raw[0], op)]['best_raw']} "
              "(highest median)")
    out = args.json or REPO / "bench" / "results" / f"s3_store_ab_{bb // 1024}k.json"
    doc = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                       "python": platform.python_version()},
           "block_bytes": bb, "blocks": n, "concurrency": conc, "rounds": args.rounds,
           "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
