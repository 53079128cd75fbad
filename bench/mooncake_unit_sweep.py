#!/usr/bin/env python3
"""kvtiers-mooncake unit sweep: the tier's unit size and thread count against the raw
client, and the raw client's own calls split the way the tier splits a job.

    PYTHONPATH=. .venv/bin/python bench/mooncake_unit_sweep.py --shape 2MiB --units 4 8 16
    PYTHONPATH=. .venv/bin/python bench/mooncake_unit_sweep.py --shape 32KiB --threads 2 4

Per setting (unit MiB x threads a kind) a fresh tier on one master, `--rounds` rounds
of a raw pass and a tier pass (`bench/mooncake_bench.py`'s passes: every loaded byte
checked), tier/raw the median of the rounds' ratios. The first setting also times
the raw client's pass split into units, called one after the other and from two
threads at once, and one thread hashing the pass's blocks from memory: what a unit
costs besides its bytes. Milliseconds are medians; the table goes to stdout and
everything to --json (default bench/results/mooncake_unit_sweep.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvtiers.sdk import checksum_slots
from kvtiers_mooncake import tier as tier_module
from kvtiers_mooncake.client import close_connections

from bench.mooncake_bench import LEASE_MS, SHAPES, LoopbackRunner, Shape, place
from tests.mooncake.master import Master

OUT = Path(__file__).parent / "results" / "mooncake_unit_sweep.json"
Pass = Callable[[], tuple[float, float]]


def split_raw(shape: Shape, per_call: int, workers: ThreadPoolExecutor | None) -> Pass:
    """The raw pass in calls of `per_call` blocks: one after the other, or on `workers`."""
    def run() -> tuple[float, float]:
        count, block, store = shape.count, shape.block, shape.store
        names = [f"split-{uuid.uuid4().hex}" for _ in range(count)]
        src, dst = shape.addresses(0), shape.addresses(count)
        starts = list(range(0, count, per_call))

        def put(lo: int) -> list[int]:
            part = src[lo:lo + per_call]
            return list(store.batch_put_from(names[lo:lo + per_call], part,
                                             [block] * len(part), shape.config))

        def get(lo: int) -> list[int]:
            part = dst[lo:lo + per_call]
            return list(store.batch_get_into(names[lo:lo + per_call], part,
                                             [block] * len(part)))

        t0 = time.perf_counter()
        codes = list(workers.map(put, starts)) if workers else [put(lo) for lo in starts]
        t1 = time.perf_counter()
        got = list(workers.map(get, starts)) if workers else [get(lo) for lo in starts]
        t2 = time.perf_counter()
        if any(c != 0 for part in codes for c in part) or \
                any(g != block for part in got for g in part):
            raise AssertionError(f"split raw pass: puts {codes}, gets {got}")
        shape.check()
        store.batch_remove(names, True)
        return t1 - t0, t2 - t1
    return run


def hash_pass(shape: Shape) -> Pass:
    def run() -> tuple[float, float]:
        t0 = time.perf_counter()
        checksum_slots(shape.pool, list(range(shape.count)))
        return time.perf_counter() - t0, 0.0
    return run


def setting(master: Master, args: argparse.Namespace, unit_mib: int, threads: int,
            extras: bool, workers: ThreadPoolExecutor) -> dict[str, Any]:
    block, count = SHAPES[args.shape]
    tier_module.UNIT_BYTES = unit_mib << 20  # read by the tier's constructor
    shape = Shape(master, args.shape, block, count, passes=args.rounds + 2,
                  options={"threads": {"load": threads, "store": threads}})
    try:
        kinds: dict[str, Pass] = {"raw": shape.raw_pass, "tier": shape.tier_pass}
        if extras:
            per_call = max(1, (unit_mib << 20) // block)
            kinds["raw_units_serial"] = split_raw(shape, per_call, None)
            kinds["raw_units_2_threads"] = split_raw(shape, per_call, workers)
            kinds["hash_one_thread"] = hash_pass(shape)
        for run in kinds.values():  # warm-up
            run()
        ms: dict[str, list[float]] = defaultdict(list)
        ratios: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.rounds):
            got = {kind: run() for kind, run in kinds.items()}
            for kind, (put, get) in got.items():
                ms[f"{kind}_store"].append(put * 1e3)
                if kind != "hash_one_thread":
                    ms[f"{kind}_load"].append(get * 1e3)
            ratios["store"].append(got["raw"][0] / got["tier"][0])
            ratios["load"].append(got["raw"][1] / got["tier"][1])
        return {"unit_mib": unit_mib, "threads": threads,
                "tier_vs_raw": {k: round(statistics.median(v), 3) for k, v in ratios.items()},
                "median_ms": {k: round(statistics.median(v), 2) for k, v in ms.items()}}
    finally:
        shape.tier.close()
        close_connections(master.address)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="2MiB")
    parser.add_argument("--units", type=int, nargs="+", default=[4, 8, 16, 32],
                        metavar="MIB", help="unit sizes to try, MiB (default 4 8 16 32)")
    parser.add_argument("--threads", type=int, nargs="+", default=[2],
                        help="load and store threads of the tier (default 2)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loopback", action="store_true",
                        help="run on the host's loopback even as root (only on a host "
                             "nothing outside can reach)")
    parser.add_argument("--json", type=Path, default=OUT)
    args = parser.parse_args()
    bad = [n for n in [*args.units, *args.threads, args.rounds] if n < 1]
    if bad:
        parser.error(f"--units, --threads and --rounds take whole numbers >= 1, got {bad}")
    rows = []
    with place(args.loopback) as (space, where), tempfile.TemporaryDirectory() as tmp, \
            ThreadPoolExecutor(2) as workers:
        runner: Any = space if space is not None else LoopbackRunner()
        master = Master(runner, Path(tmp), lease_ms=LEASE_MS)
        master.start()
        try:
            settings = list(itertools.product(args.units, args.threads))
            for n, (unit, threads) in enumerate(settings):
                row = setting(master, args, unit, threads, n == 0, workers)
                rows.append(row)
                print(f"[{n + 1}/{len(settings)}] unit {unit} MiB, {threads} threads: "
                      f"tier/raw store {row['tier_vs_raw']['store']:.2f} "
                      f"load {row['tier_vs_raw']['load']:.2f}  "
                      f"ms {row['median_ms']}", flush=True)
        finally:
            close_connections(master.address)
            master.stop()
    result = {"shape": args.shape, "rounds": args.rounds, "where": where,
              "machine": f"{os.uname().nodename} {os.cpu_count()} cores",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": " ".join(["bench/mooncake_unit_sweep.py", *sys.argv[1:]]),
              "settings": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
