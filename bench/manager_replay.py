#!/usr/bin/env python3
"""Replay the PR #46216-shaped chat workload through the scheduler-side manager with
the engine's call protocol and report block operations per second, Python heap per
resident block, hit rate and prepare_store latency. Writes JSON.

    .venv/bin/python bench/manager_replay.py --json bench/results/manager_replay.json

Protocol per request (as the scheduler calls it): prefix lookup up to the first
miss; prepare_load + touch of the hits; prepare_store of the new prompt blocks.
When the request leaves the in-flight window (~100 requests later): complete_load,
complete_store, prepare_store + complete_store of the output blocks, and the
request-finished hook. One operation = one block in one call.

`--trace FILE` writes the event stream so another engine's manager (the vLLM
baseline, bench/vllm_baseline.py) replays exactly the same requests.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kvtiers.bench.workload import Request, Workload, WorkloadSpec
from kvtiers.manager import TieringOffloadingManager
from kvtiers.plugins import get_registry
from kvtiers.policies.base import EvictionPolicy


def build_events(spec: WorkloadSpec) -> list[tuple[str, Request]]:
    return list(Workload(spec))


def replay(
    events: list[tuple[str, Request]], num_slots: int, policy: str, measure_memory: bool = False
) -> dict[str, Any]:
    cls = get_registry().get_policy(policy).record.load()
    assert issubclass(cls, EvictionPolicy), cls
    mgr = TieringOffloadingManager(num_slots, cls.for_slots(num_slots))
    ops = 0
    hits_blocks = 0
    prompt_blocks = 0
    store_lat: list[float] = []
    inflight: dict[str, tuple[list[bytes], list[bytes]]] = {}
    lookup_prefix = mgr.lookup_prefix
    prepare_load, touch, prepare_store = mgr.prepare_load, mgr.touch, mgr.prepare_store
    complete_load, complete_store = mgr.complete_load, mgr.complete_store
    perf = time.perf_counter
    if measure_memory:
        tracemalloc.start()
    gc.disable()
    t0 = perf()
    for i, (kind, req) in enumerate(events):
        if kind == "start":
            keys = req.prompt_keys
            res = lookup_prefix(keys)
            n = res.hits
            ops += min(n + 1, len(keys))
            prompt_blocks += len(keys)
            hits_blocks += n
            loads = keys[:n]
            if n:
                prepare_load(loads)
                touch(loads)
                ops += 2 * n
            new = keys[n:]
            t = perf()
            out = prepare_store(new)
            store_lat.append(perf() - t)
            ops += len(new)
            inflight[req.req_id] = (loads, out.keys if out is not None else [])
        else:
            loads, stored = inflight.pop(req.req_id)
            if loads:
                complete_load(loads)
                ops += len(loads)
            if stored:
                complete_store(stored)
                ops += len(stored)
            okeys = req.output_keys
            if okeys:
                t = perf()
                out = prepare_store(okeys)
                store_lat.append(perf() - t)
                ops += len(okeys)
                if out is not None and out.keys:
                    complete_store(out.keys)
                    ops += len(out.keys)
            mgr.on_request_finished(req.req_id)
        if i % 64 == 0:
            mgr.step()
            mgr.take_events()
    elapsed = perf() - t0
    gc.enable()
    result = {
        "system": "kvtiers",
        "policy": policy,
        "ops": ops,
        "seconds": elapsed,
        "ops_per_s": ops / elapsed,
        "hit_rate": hits_blocks / max(1, prompt_blocks),
        "resident_blocks": mgr.stats()["pool"]["resident"],
        "evictions": mgr.stats()["pool"]["evictions"],
        "prepare_store_p50_us": statistics.median(store_lat) * 1e6,
        "prepare_store_p99_us": statistics.quantiles(store_lat, n=100)[98] * 1e6,
    }
    if measure_memory:
        # What the caller still holds (results of calls in flight) is not manager state.
        inflight.clear()
        del loads, keys, new, out
        mgr.take_events()
        gc.collect()
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        # Count only memory allocated by kvtiers' own code (the manager, policy,
        # allocator), not the caller's key objects or this script's lists.
        filt = [tracemalloc.Filter(True, "*kvtiers*"), tracemalloc.Filter(False, "*workload.py"),
                tracemalloc.Filter(False, "*hashing.py")]
        held = sum(s.size for s in snap.filter_traces(filt).statistics("filename"))
        result["heap_bytes"] = held
        result["heap_bytes_per_resident_block"] = held / max(1, result["resident_blocks"])
    mgr.close()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sessions", type=int, default=2000, help="total sessions (default 2000)")
    ap.add_argument("--prefixes", type=int, default=200)
    ap.add_argument("--prefix-tokens", type=int, default=10_000)
    ap.add_argument("--slots", type=int, default=100_000, help="CPU pool blocks (default 100000)")
    ap.add_argument("--policy", default="lru", help="eviction policy name(s), comma-separated")
    ap.add_argument("--runs", type=int, default=3, help="timed runs; the median is reported")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--trace", type=Path, help="also write the event stream (pickle) here")
    args = ap.parse_args()

    spec = WorkloadSpec(
        num_prefixes=args.prefixes, prefix_tokens=args.prefix_tokens,
        total_sessions=args.sessions, seed=args.seed,
    )
    t = time.perf_counter()
    events = build_events(spec)
    built_s = time.perf_counter() - t
    print(f"workload: {len(events)//2} requests built in {built_s:.1f}s", file=sys.stderr)
    if args.trace:
        with open(args.trace, "wb") as f:
            pickle.dump([(k, r.req_id, r.prompt_keys, r.output_keys) for k, r in events], f)
    results = []
    for policy in args.policy.split(","):
        runs = [replay(events, args.slots, policy) for _ in range(args.runs)]
        mem = replay(events, args.slots, policy, measure_memory=True)
        best = sorted(runs, key=lambda r: r["ops_per_s"])[len(runs) // 2]
        best["runs_ops_per_s"] = [r["ops_per_s"] for r in runs]
        best["heap_bytes_per_resident_block"] = mem["heap_bytes_per_resident_block"]
        results.append(best)
    print(
        f"{'system':10} {'policy':7} {'Mops/s':>7} {'hit%':>6} {'B/blk':>6} {'p50 us':>7} "
        f"{'p99 us':>7}"
    )
    for r in results:
        print(
            f"{r['system']:10} {r['policy']:7} {r['ops_per_s']/1e6:7.2f} "
            f"{100*r['hit_rate']:6.1f} {r['heap_bytes_per_resident_block']:6.0f} "
            f"{r['prepare_store_p50_us']:7.1f} {r['prepare_store_p99_us']:7.1f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": platform.node(), "python": platform.python_version(),
            "spec": vars(spec) | {"hash_seed": str(spec.hash_seed)}, "slots": args.slots,
            "results": results,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
