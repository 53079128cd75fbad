#!/usr/bin/env python3
"""Replay the PR #46216-shaped chat workload through the scheduler-side manager with
the engine's call protocol and report block operations per second, Python heap per
resident block, hit rate and prepare_store latency. Writes JSON.

    .venv/bin/python bench/manager_replay.py --json bench/results/manager_replay.json
    .venv/bin/python bench/manager_replay.py --policy lru,arc,sieve --runs 5 \
        --vllm-python $VLLM_VENV/bin/python --json bench/results/manager_replay_vs_vllm.json

Protocol per request (as the scheduler calls it): prefix lookup up to the first
miss; prepare_load + touch of the hits; prepare_store of the new prompt blocks.
When the request leaves the in-flight window (~100 requests later): complete_load,
complete_store, prepare_store + complete_store of the output blocks, and the
request-finished hook. One operation = one block in one call.

`--pinned-in-place`: the pool's policy keeps pinned blocks in place
(`EvictionPolicy.keep_pinned_in_place`, what kvtiers-vllm's spec asks for) and the
protocol is vLLM's request-scoped recency as kvtiers-vllm drives it: no touch after
prepare_load; the blocks a prepare_store gives slots are placed tail first
(`reorder`, tiers not told); at the request's end one `reorder` of everything it
loaded and stored, tail first, the loaded blocks as uses. Operations are counted as
in the default protocol (the recency calls stand in for the touch), so the rates of
the two compare as the same workload's.

`--trace FILE` writes the event stream so another engine's manager (the vLLM
baseline, bench/vllm_baseline.py) replays exactly the same requests.
`--vllm-python` runs that baseline in its own venv, interleaved with kvtiers' runs
(kvtiers, vLLM, kvtiers, vLLM, ... per policy vLLM has), and reports each pair's
ratio. Latencies (p50/p99) are kept for lookup_prefix, prepare_store,
complete_store and step (vLLM: its prefix scan and on_schedule_end).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kvtiers.bench.workload import Request, Workload, WorkloadSpec
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.manager import TieringOffloadingManager, slotops
from kvtiers.plugins import get_registry
from kvtiers.policies import slot_links


def build_events(spec: WorkloadSpec) -> list[tuple[str, Request]]:
    return list(Workload(spec))


CALLS = ("lookup_prefix", "prepare_store", "complete_store", "step")


def percentiles(lat: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """p50 / p99 in microseconds of each call's latencies."""
    out = {}
    for name, xs in lat.items():
        if len(xs) >= 2:
            q = statistics.quantiles(xs, n=100)
            out[name] = {"p50_us": statistics.median(xs) * 1e6, "p99_us": q[98] * 1e6,
                         "calls": len(xs)}
    return out


def replay(
    events: list[tuple[str, Request]], num_slots: int, policy: str, measure_memory: bool = False,
    native: bool = True, in_place: bool = False,
) -> dict[str, Any]:
    """One timed replay. `native`: the pool's per-block loops and the slot policies'
    index, list moves and ghosts in C (when built), else in Python
    (kvtiers.manager.slotops, kvtiers.policies.slot_links). `in_place`: in-place
    pins and request-scoped recency (see the module docstring)."""
    cls = get_registry().get_policy(policy).record.load()
    assert issubclass(cls, EvictionPolicy), cls
    slotops.USE_NATIVE = native and slotops.NATIVE
    slot_links.USE_NATIVE = native and slot_links.NATIVE
    if measure_memory:
        # Before the manager is built: its per-slot arrays count (they are the pool's).
        tracemalloc.start()
    pool_policy = cls.for_slots(num_slots)
    if in_place and not pool_policy.keep_pinned_in_place():
        raise SystemExit(f"policy {policy!r} has no in-place pins")
    mgr = TieringOffloadingManager(num_slots, pool_policy)
    path = "native" if slotops.USE_NATIVE and slot_links.USE_NATIVE else (
        "python" if not (slotops.USE_NATIVE or slot_links.USE_NATIVE) else "mixed"
    )
    ops = 0
    hits_blocks = 0
    prompt_blocks = 0
    lat: dict[str, list[float]] = {name: [] for name in CALLS}
    lat_scan, lat_store, lat_done, lat_step = (lat[name] for name in CALLS)
    inflight: dict[str, tuple[list[bytes], list[bytes]]] = {}
    lookup_prefix = mgr.lookup_prefix
    prepare_load, touch, prepare_store = mgr.prepare_load, mgr.touch, mgr.prepare_store
    complete_load, complete_store = mgr.complete_load, mgr.complete_store
    step, take_events = mgr.step, mgr.take_events
    reorder = mgr.reorder
    perf = time.perf_counter
    gc.disable()
    cpu0 = time.process_time()
    t0 = perf()
    for i, (kind, req) in enumerate(events):
        if kind == "start":
            keys = req.prompt_keys
            t = perf()
            res = lookup_prefix(keys)
            lat_scan.append(perf() - t)
            n = res.hits
            ops += min(n + 1, len(keys))
            prompt_blocks += len(keys)
            hits_blocks += n
            loads = keys[:n]
            if n:
                prepare_load(loads)
                if not in_place:
                    touch(loads)
                ops += 2 * n
            new = keys[n:]
            t = perf()
            out = prepare_store(new)
            if in_place and out is not None and out.keys:
                reorder(out.keys[::-1], tiers=False)  # ranked tail first from now on
            lat_store.append(perf() - t)
            ops += len(new)
            inflight[req.req_id] = (loads, out.keys if out is not None else [])
        else:
            loads, stored = inflight.pop(req.req_id)
            if loads:
                complete_load(loads)
                ops += len(loads)
            if stored:
                t = perf()
                complete_store(stored)
                lat_done.append(perf() - t)
                ops += len(stored)
            okeys = req.output_keys
            if okeys:
                t = perf()
                out = prepare_store(okeys)
                lat_store.append(perf() - t)
                ops += len(okeys)
                if out is not None and out.keys:
                    if in_place:
                        reorder(out.keys[::-1], tiers=False)
                    t = perf()
                    complete_store(out.keys)
                    lat_done.append(perf() - t)
                    ops += len(out.keys)
            if in_place:  # the request's recency, tail first, its loads as uses
                done = out.keys if okeys and out is not None else []
                reorder([*loads, *stored, *done][::-1], set(loads))
            mgr.on_request_finished(req.req_id)
        if i % 64 == 0:
            t = perf()
            step()
            lat_step.append(perf() - t)
            take_events()
    elapsed = perf() - t0
    cpu = time.process_time() - cpu0
    gc.enable()
    stats = mgr.stats()["pool"]
    result = {
        "system": "kvtiers",
        "policy": policy,
        "path": path,
        "pinned_in_place": in_place,
        "ops": ops,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "ops_per_s": ops / elapsed,
        "ops_per_cpu_s": ops / cpu,
        "hit_rate": hits_blocks / max(1, prompt_blocks),
        "resident_blocks": stats["resident"],
        "evictions": stats["evictions"],
        "prepare_store_p50_us": statistics.median(lat_store) * 1e6,
        "prepare_store_p99_us": statistics.quantiles(lat_store, n=100)[98] * 1e6,
        "latency": percentiles(lat),
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
        # allocator, per-slot arrays), not the caller's key objects or this
        # script's lists.
        filt = [tracemalloc.Filter(True, "*kvtiers*"), tracemalloc.Filter(False, "*workload.py"),
                tracemalloc.Filter(False, "*hashing.py")]
        by_file = snap.filter_traces(filt).statistics("filename")
        held = sum(s.size for s in by_file)
        result["heap_bytes"] = held
        result["heap_bytes_per_resident_block"] = held / max(1, result["resident_blocks"])
        result["heap_by_file"] = {
            s.traceback[0].filename.rsplit("kvtiers/", 1)[-1]: s.size for s in by_file[:8]
        }
    mgr.close()
    return result


class VllmServer:
    """bench/vllm_baseline.py --serve in vLLM's venv, the trace loaded once; one
    replay per `run()`."""

    def __init__(self, python: str, trace: Path, slots: int):
        script = Path(__file__).with_name("vllm_baseline.py")
        self.proc = subprocess.Popen(
            [python, str(script), str(trace), "--slots", str(slots), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        hello = self._read()
        self.version = hello.get("vllm", "?")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vllm_baseline.py --serve exited ({self.proc.wait()})")
        return json.loads(line)  # type: ignore[no-any-return]

    def run(self, policy: str, memory: bool = False) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"policy": policy, "memory": memory}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def load_now() -> dict[str, float]:
    one, five, _ = os.getloadavg()
    return {"loadavg_1m": one, "loadavg_5m": five}


def timed(run: Any) -> dict[str, Any]:
    before = load_now()
    res: dict[str, Any] = run()
    res["load_before"] = before
    res["load_after"] = load_now()
    res["cpu_share"] = res["cpu_seconds"] / res["seconds"]
    return res


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = dict(sorted(runs, key=lambda r: r["ops_per_s"])[len(runs) // 2])
    best["runs_ops_per_s"] = [r["ops_per_s"] for r in runs]
    # Per run, in order (pairs them with the other system's runs by index).
    best["runs"] = [
        {k: r[k] for k in ("ops_per_s", "ops_per_cpu_s", "cpu_share", "load_before")}
        for r in runs
    ]
    return best


VLLM_POLICIES = ("lru", "arc")  # the policies vLLM 0.33's CPUOffloadingManager has


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sessions", type=int, default=2000, help="total sessions (default 2000)")
    ap.add_argument("--prefixes", type=int, default=200)
    ap.add_argument("--prefix-tokens", type=int, default=10_000)
    ap.add_argument("--slots", type=int, default=100_000, help="CPU pool blocks (default 100000)")
    ap.add_argument("--policy", default="lru", help="eviction policy name(s), comma-separated")
    ap.add_argument("--runs", type=int, default=3,
                    help="timed runs (pairs with --vllm-python); the median is reported")
    ap.add_argument("--vllm-python", help="vLLM venv's python: interleave each kvtiers run "
                    "with a vLLM run of the same policy (lru, arc) on the same trace")
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    ap.add_argument("--memory-only", action="store_true",
                    help="only the tracemalloc runs (heap per resident block, hit rate)")
    ap.add_argument("--no-vllm-memory", action="store_true",
                    help="skip vLLM's tracemalloc runs (slow) but keep kvtiers'")
    ap.add_argument("--paths", default="native",
                    help="kvtiers paths to time, comma-separated: native (the C helper, "
                         "when built), python (its pure-Python fallback)")
    ap.add_argument("--pinned-in-place", action="store_true",
                    help="in-place pins and request-scoped recency (kvtiers-vllm's protocol)")
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
    trace = args.trace
    if args.vllm_python and trace is None:
        trace = Path(f"/tmp/manager_replay_trace_{os.getpid()}.pkl")
    if trace:
        with open(trace, "wb") as f:
            pickle.dump([(k, r.req_id, r.prompt_keys, r.output_keys) for k, r in events], f)
    if args.memory_only:
        mems = [
            replay(events, args.slots, p, measure_memory=True, native=kp == "native",
                   in_place=args.pinned_in_place)
            for p in args.policy.split(",") for kp in args.paths.split(",")
        ]
        for r in mems:
            print(f"{r['policy']:6} {r['path']:6} hit {100 * r['hit_rate']:.4f}%  heap/resident "
                  f"block {r['heap_bytes_per_resident_block']:.1f} B  "
                  f"({r['resident_blocks']} resident)")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({
                "machine": platform.node(), "python": platform.python_version(),
                "spec": vars(spec) | {"hash_seed": str(spec.hash_seed)}, "slots": args.slots,
                "memory": mems}, indent=2))
        return 0
    vl = VllmServer(args.vllm_python, trace, args.slots) if args.vllm_python else None
    policies = args.policy.split(",")
    kpaths = args.paths.split(",")
    runs: dict[str, list[dict[str, Any]]] = {f"{p}/{k}": [] for p in policies for k in kpaths}
    vruns: dict[str, list[dict[str, Any]]] = {
        p: [] for p in policies if p in VLLM_POLICIES and args.vllm_python
    }
    pairs: list[dict[str, Any]] = []
    try:
        # Interleaved: kvtiers then vLLM, policy by policy, run after run, so that
        # the machine's load (other jobs) falls on both alike; each pair's ratio is
        # kept, not only the medians.
        for i in range(args.runs):
            for policy in policies:
                kvs = {}
                for kp in kpaths:
                    kv = timed(
                        lambda p=policy, n=kp == "native": replay(
                            events, args.slots, p, native=n, in_place=args.pinned_in_place
                        )
                    )
                    runs[f"{policy}/{kp}"].append(kv)
                    kvs[kp] = kv
                line = f"run {i} {policy:6} kvtiers " + " ".join(
                    f"{kp} {kv['ops_per_s']/1e6:5.2f}" for kp, kv in kvs.items()
                ) + " Mops/s"
                if vl is not None and policy in vruns:
                    v = timed(lambda p=policy: vl.run(p))
                    vruns[policy].append(v)
                    pair = {"run": i, "policy": policy, "vllm_ops_per_s": v["ops_per_s"],
                            "loadavg_1m": v["load_before"]["loadavg_1m"],
                            "vllm_cpu_share": v["cpu_share"],
                            "vllm_ops_per_cpu_s": v["ops_per_cpu_s"]}
                    for kp, kv in kvs.items():
                        pair[f"kvtiers_{kp}_ops_per_s"] = kv["ops_per_s"]
                        pair[f"ratio_{kp}"] = kv["ops_per_s"] / v["ops_per_s"]
                        # Per CPU-second: what each process got of the cores aside.
                        pair[f"kvtiers_{kp}_ops_per_cpu_s"] = kv["ops_per_cpu_s"]
                        pair[f"cpu_ratio_{kp}"] = kv["ops_per_cpu_s"] / v["ops_per_cpu_s"]
                    pairs.append(pair)
                    line += f"  vLLM {v['ops_per_s']/1e6:5.2f}  ratio " + " ".join(
                        f"{kp} {pair[f'ratio_{kp}']:5.2f}x" for kp in kvs
                    )
                print(line, f"(load {load_now()['loadavg_1m']:.1f})", file=sys.stderr)
                if args.json:  # every run so far, in case the series is cut short
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps({
                        "partial": True, "machine": platform.node(), "cpus": os.cpu_count(),
                        "spec": vars(spec) | {"hash_seed": str(spec.hash_seed)},
                        "slots": args.slots, "pairs": pairs, "kvtiers_runs": runs,
                        "vllm_runs": vruns,
                    }, indent=2))
        results = []
        for policy in policies:
            for kp in kpaths:
                best = median_of(runs[f"{policy}/{kp}"])
                mem = None
                if not args.no_memory:  # the C index is smaller: each path measured
                    mem = replay(events, args.slots, policy, measure_memory=True,
                                 native=kp == "native", in_place=args.pinned_in_place)
                if mem is not None:
                    for k in ("heap_bytes", "heap_bytes_per_resident_block", "heap_by_file"):
                        best[k] = mem[k]
                results.append(best)
        vresults = []
        for policy, vr in vruns.items():
            best = median_of(vr)
            if not (args.no_memory or args.no_vllm_memory) and vl is not None:
                mem = vl.run(policy, memory=True)
                for k in ("heap_bytes", "heap_bytes_per_resident_block", "heap_by_file"):
                    best[k] = mem[k]
            for kp in kpaths:
                ratios = [p[f"ratio_{kp}"] for p in pairs if p["policy"] == policy]
                best[f"pair_ratios_{kp}"] = ratios
                best[f"median_pair_ratio_{kp}"] = statistics.median(ratios)
            vresults.append(best)
    finally:
        if vl is not None:
            vl.close()
        if args.vllm_python and args.trace is None and trace is not None:
            trace.unlink(missing_ok=True)
    print(
        f"{'system':10} {'policy':7} {'Mops/s':>7} {'hit%':>7} {'B/blk':>6} "
        + " ".join(f"{c[:14]:>14}" for c in CALLS) + "  (p50/p99 us)"
    )
    for r in results + vresults:
        lat = r["latency"]
        cells = " ".join(
            f"{lat[c]['p50_us']:6.1f}/{lat[c]['p99_us']:<7.0f}" if c in lat else f"{'-':>14}"
            for c in CALLS
        )
        name = r["system"][:10] if r["system"] != "kvtiers" else f"kvtiers/{r['path'][:2]}"
        print(
            f"{name:10} {r['policy']:7} {r['ops_per_s']/1e6:7.2f} "
            f"{100*r['hit_rate']:7.2f} {r.get('heap_bytes_per_resident_block', 0):6.0f} {cells}"
        )
    for r in vresults:
        for kp in kpaths:
            print(f"ratio {r['policy']} ({kp}): median {r[f'median_pair_ratio_{kp}']:.2f}x, "
                  "pairs " + ", ".join(f"{x:.2f}" for x in r[f"pair_ratios_{kp}"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": platform.node(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "vllm": vl.version if vl is not None else None,
            "native_built": slotops.NATIVE, "policies_native_built": slot_links.NATIVE,
            "paths": kpaths,
            "spec": vars(spec) | {"hash_seed": str(spec.hash_seed)}, "slots": args.slots,
            "results": results, "vllm_results": vresults, "pairs": pairs,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
