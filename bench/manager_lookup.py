#!/usr/bin/env python3
"""What a manager lookup costs the scheduler, ns per key: a pool hit, a miss that
asks a secondary tier (the core's memory tier), the same with a request id, and
through a tier that answers per request (`lookup_in_request`); a 16-hit prefix
scan that ends on a tier miss.

A/B between two source trees of kvtiers-core (`--against DIR`: e.g. main's
kvtiers-core/src): worker processes of each alternate round by round (A, B, A,
B, ...), so the machine's load hits both alike; per variant the best round's ns
per key (each round: its best pass over the keys; the least disturbed), medians
of the rounds in the JSON too, and the this/A ratio.
Variants a tree lacks (request ids before `lookup_in_request`) are left out.

    python bench/manager_lookup.py --against /work/main/kvtiers-core/src \\
        --json bench/results/manager_lookup.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
SLOTS = 4096
BLOCK = 4096
KEYS = 2048
CALLS = 40  # passes over the keys per round (the best one counts)


def worker() -> dict[str, float]:
    """One round in this process, with whatever kvtiers the path has: ns per key."""
    from kvtiers.contract.keys import make_key
    from kvtiers.contract.lookup import LookupResult
    from kvtiers.contract.namespace import BlockGeometry, Namespace
    from kvtiers.contract.pool_view import PoolView
    from kvtiers.contract.tier import TierContext
    from kvtiers.manager import TieringOffloadingManager
    from kvtiers.policies.lru import LRUPolicy
    from kvtiers.tiers.memory import MemoryTier

    ns = Namespace("bench/manager-lookup", (BlockGeometry(1, 1, 1024, "float16", 1),))
    opts = {"capacity_bytes": 64 * BLOCK, "eviction_policy": "lru", "threads": 1}

    class PerRequest(MemoryTier):
        def lookup_in_request(self, key: bytes, request_id: str) -> LookupResult:
            return self.lookup(key)

    def manager(cls: type[MemoryTier]) -> Any:
        pool = PoolView.anonymous(SLOTS, BLOCK)
        tier = cls(TierContext(pool, ns), opts)
        return TieringOffloadingManager(SLOTS, LRUPolicy.for_slots(SLOTS), [tier])

    hits = [make_key(i.to_bytes(32, "big")) for i in range(KEYS)]
    misses = [make_key((i + 10**6).to_bytes(32, "big")) for i in range(KEYS)]
    plain, per_request = manager(MemoryTier), manager(PerRequest)
    for mgr in (plain, per_request):
        for i in range(0, KEYS, 256):
            part = hits[i:i + 256]
            assert mgr.prepare_store(part) is not None
            mgr.complete_store(part)
        mgr.drain(30)
    has_ids = hasattr(plain, "request_lookups")
    prefix = [*hits[:16], misses[0]]

    def timed(fn: Any, keys: list[bytes], *args: Any) -> float:
        """The best of CALLS passes over `keys` (a pass preempted counts not)."""
        best = float("inf")
        for _ in range(CALLS):
            t0 = time.perf_counter_ns()
            for k in keys:
                fn(k, *args)
            best = min(best, time.perf_counter_ns() - t0)
        return best / len(keys)

    out = {
        "pool hit": timed(plain.lookup, hits),
        "tier miss": timed(plain.lookup, misses),
    }
    best = float("inf")
    for _ in range(CALLS):
        t0 = time.perf_counter_ns()
        for _ in range(64):
            plain.lookup_prefix(prefix)
        best = min(best, time.perf_counter_ns() - t0)
    out["prefix of 16 hits + tier miss"] = best / (64 * len(prefix))
    if has_ids:
        out["tier miss, request id"] = timed(plain.lookup, misses, None, "req-1")
        out["per-request tier miss, no id"] = timed(per_request.lookup, misses)
        out["per-request tier miss, request id"] = timed(
            per_request.lookup, misses, None, "req-1")
    for mgr in (plain, per_request):
        mgr.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--against", help="kvtiers-core/src of the tree to compare (A)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default="bench/results/manager_lookup.json")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker()))
        return
    trees = {"this": str(HERE / "kvtiers-core" / "src")}
    if args.against:
        trees = {"A": args.against, "this": trees["this"]}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            env = {**os.environ, "PYTHONPATH": src}
            done = subprocess.run([sys.executable, __file__, "--worker"], env=env,
                                  capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout))
    table: dict[str, dict[str, Any]] = {}
    for name, rounds in runs.items():
        for variant in rounds[0]:
            values = [r[variant] for r in rounds]
            row = table.setdefault(variant, {})
            row[name] = {"best_ns": min(values), "median_ns": statistics.median(values)}
    title = f"ns per key (best of {args.rounds})"
    print(f"{title:40}"
          + "".join(f"{n:>10}" for n in trees) + ("   this/A" if "A" in trees else ""))
    for variant, row in table.items():
        cells = "".join(f"{row[n]['best_ns']:10.0f}" if n in row else f"{'-':>10}"
                        for n in trees)
        ratio = ""
        if "A" in row:
            row["ratio_best"] = row["this"]["best_ns"] / row["A"]["best_ns"]
            ratio = f"{row['ratio_best']:9.3f}"
        print(f"{variant:40}{cells}{ratio}")
    result = {"bench": "manager_lookup", "rounds": args.rounds, "keys": KEYS,
              "calls": CALLS, "trees": trees, "loadavg": os.getloadavg(),
              "python": platform.python_version(), "results": table}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average {os.getloadavg()[0]:.2f}; wrote {args.json}")


if __name__ == "__main__":
    main()
