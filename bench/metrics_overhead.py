"""What metrics cost the scheduler per call: the manager alone, through
`MeteredManager` with per-call timing (the default), and with it off (the config's
`metrics.scheduler_call_timing: false`).

A real manager over a CPU pool of SLOTS slots, half of them filled; per call kind,
the best (minimum) round of ROUNDS rounds of CALLS calls each, in ns per call -
the least disturbed by other processes on a shared machine (medians are in the
JSON too); the three variants interleaved round by round, so noise hits them alike. Prints a table,
writes JSON (--json, default bench/results/metrics_overhead.json).

    PYTHONPATH=kvtiers-core/src python bench/metrics_overhead.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtiers.config import load_config
from kvtiers.contract.keys import make_key
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.manager.build import build_manager
from kvtiers.metrics.instrument import MeteredManager
from kvtiers.metrics.recorder import MetricsRecorder

BLOCK = 4096
SLOTS = 4096
NS = Namespace("bench/metrics-overhead", (BlockGeometry(1, 1, 1024, "float16", 1),))


def _manager(recorder: MetricsRecorder | None) -> Any:
    pool = PoolView.anonymous(SLOTS, BLOCK)
    config = load_config({"cpu_bytes_to_use": pool.nbytes})
    return build_manager(config, pool, NS, metrics=recorder)


def _fill(mgr: Any, keys: list[bytes]) -> None:
    for i in range(0, len(keys), 256):
        part = keys[i : i + 256]
        out = mgr.prepare_store(part)
        assert out is not None
        mgr.complete_store(part)


def _calls(mgr: Any, hits: list[bytes], misses: list[bytes]) -> dict[str, Callable[[], None]]:
    lookup, lookup_prefix, touch = mgr.lookup, mgr.lookup_prefix, mgr.touch
    prefix = hits[:16]
    one = hits[:1]

    def lookup_hit() -> None:
        for k in hits:
            lookup(k)

    def lookup_miss() -> None:
        for k in misses:
            lookup(k)

    def prefix16() -> None:
        for _ in range(len(hits)):
            lookup_prefix(prefix)

    def touch1() -> None:
        for _ in range(len(hits)):
            touch(one)

    return {"lookup (hit)": lookup_hit, "lookup (miss)": lookup_miss,
            "lookup_prefix (16 hits)": prefix16, "touch (1 key)": touch1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=101)
    ap.add_argument("--json", type=Path,
                    default=Path(__file__).parent / "results" / "metrics_overhead.json")
    args = ap.parse_args()
    keys = [make_key(i.to_bytes(32, "big"), 0) for i in range(SLOTS // 2)]
    hits = keys[: args.calls] if args.calls <= len(keys) else keys
    misses = [make_key((10**9 + i).to_bytes(32, "big"), 0) for i in range(len(hits))]
    variants: dict[str, Any] = {}
    raw = _manager(None)
    _fill(raw, keys)
    variants["manager alone"] = raw
    for label, timing in (("metered, timing on", True), ("metered, timing off", False)):
        rec = MetricsRecorder()
        m = MeteredManager(_manager(rec), rec, call_timing=timing)
        _fill(m, keys)
        variants[label] = m
    calls = {label: _calls(m, hits, misses) for label, m in variants.items()}
    samples: dict[str, dict[str, list[float]]] = {
        kind: {label: [] for label in variants} for kind in calls["manager alone"]}
    for _ in range(args.rounds):
        for kind in samples:
            for label in variants:
                fn = calls[label][kind]
                t0 = time.perf_counter_ns()
                fn()
                samples[kind][label].append((time.perf_counter_ns() - t0) / len(hits))
    rows = []
    print(f"{'call':26} " + " ".join(f"{label:>22}" for label in variants)
          + f" {'timing costs':>14} {'off costs':>11}")
    for kind, by in samples.items():
        med = {label: min(v) for label, v in by.items()}
        medians = {label: statistics.median(v) for label, v in by.items()}
        on = med["metered, timing on"] - med["manager alone"]
        off = med["metered, timing off"] - med["manager alone"]
        rows.append({"call": kind, **{f"{k} ns": round(v, 1) for k, v in med.items()},
                     **{f"{k} ns (median)": round(v, 1) for k, v in medians.items()},
                     "timing on extra ns": round(on, 1), "timing off extra ns": round(off, 1)})
        print(f"{kind:26} " + " ".join(f"{med[label]:>19.0f} ns" for label in variants)
              + f" {on:>11.0f} ns {off:>8.0f} ns")
    for m in variants.values():
        m.close()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine()},
        "calls_per_round": len(hits), "rounds": args.rounds, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
