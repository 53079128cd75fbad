#!/usr/bin/env python3
"""Replay a manager_replay.py trace through vLLM 0.33's scheduler-side
`CPUOffloadingManager` (LRU or ARC): the baseline for kvtiers' `TieringOffloadingManager`.

Runs in a separate venv that has vLLM (see /work/shared/ENVIRONMENT.md, "Running
vLLM's offloading code as a baseline"); it imports nothing from kvtiers:

    .venv/bin/python bench/manager_replay.py --trace /tmp/trace.pkl
    /work/vllm-venv/bin/python bench/vllm_baseline.py /tmp/trace.pkl \\
        --json bench/results/manager_replay_vllm_baseline.json

The protocol and the operation count are those of manager_replay.py's `replay()`.
Per start: prefix lookup with `lookup()` per block until the first MISS, as vLLM's
scheduler scans (`min(hits + 1, len)` operations; hits are the leading blocks that
are HIT, i.e. readable now); prepare_load + touch of the hits; prepare_store of the
remaining prompt blocks. Per finish: complete_load, complete_store of what was
stored, prepare_store + complete_store of the output blocks, on_request_finished.
One operation = one block in one call; `on_schedule_end` every 64 events stands in
for kvtiers' `step()`.

vLLM-specific caller work, as its scheduler does it: one `ReqContext` per request,
`on_new_request` at start (timed) and, unless --no-positions, the end-token
position of every key recorded on the context with `set_offload_key_position`
(the scheduler's `update_offload_keys`; vLLM's LRU uses it to order a request's
blocks). Building the context and recording positions is caller work and is left
out of the timing. Trace keys are converted to vLLM keys before anything is
timed or traced, so neither side pays for its caller's key objects.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import pickle
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import vllm
from vllm.v1.kv_offload.base import (
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

SYSTEM = "vllm-0.33 CPUOffloadingManager"
POLICY = "lru"
KVTIERS_GROUP_BYTES = 4  # kvtiers.contract.keys.GROUP_BYTES: a key is hash + 4-byte group


def load_trace(path: Path) -> tuple[list[tuple[str, str, list[bytes]]], dict[str, Any]]:
    """Read manager_replay.py's trace and convert its keys to vLLM `OffloadKey`s,
    one object per distinct key. Returns events `(kind, req_id, keys)` (the prompt
    keys for a start, the output keys for a finish) and a description of the trace."""
    raw_bytes = path.read_bytes()
    raw = pickle.loads(raw_bytes)
    memo: dict[bytes, bytes] = {}
    gb = KVTIERS_GROUP_BYTES

    def convert(keys: list[bytes]) -> list[bytes]:
        out = []
        for k in keys:
            v = memo.get(k)
            if v is None:
                v = memo[k] = make_offload_key(k[:-gb], int.from_bytes(k[-gb:], "big"))
            out.append(v)
        return out

    events = []
    sessions = set()
    prompt_blocks = output_blocks = 0
    for kind, req_id, prompt_keys, output_keys in raw:
        if kind == "start":
            keys = convert(prompt_keys)
            prompt_blocks += len(keys)
            sessions.add(req_id.split("-", 1)[0])
        elif kind == "finish":
            keys = convert(output_keys)
            output_blocks += len(keys)
        else:
            raise ValueError(f"unknown event kind {kind!r} in {path}")
        events.append((kind, req_id, keys))
    info = {
        "trace": str(path),
        "trace_sha256": hashlib.sha256(raw_bytes).hexdigest(),
        "requests": len(events) // 2,
        "sessions": len(sessions),
        "distinct_keys": len(memo),
        "prompt_blocks": prompt_blocks,
        "output_blocks": output_blocks,
    }
    return events, info


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


def replay(events: list[tuple[str, str, list[bytes]]], num_slots: int, *,
           policy: str = POLICY, positions: bool = True, block_tokens: int = 16,
           measure_memory: bool = False) -> dict[str, Any]:
    if measure_memory:  # before the manager is built: what it allocates up front counts
        tracemalloc.start()
    mgr = CPUOffloadingManager(num_chunks=num_slots, cache_policy=policy)
    HIT, MISS = LookupResult.HIT, LookupResult.MISS
    lookup, on_new_request = mgr.lookup, mgr.on_new_request
    prepare_load, touch, prepare_store = mgr.prepare_load, mgr.touch, mgr.prepare_store
    complete_load, complete_store = mgr.complete_load, mgr.complete_store
    on_request_finished, on_schedule_end = mgr.on_request_finished, mgr.on_schedule_end
    step_ctx = ScheduleEndContext((), ())
    ops = 0
    hits_blocks = 0
    prompt_blocks = 0
    inserted = 0
    refused = 0
    lat: dict[str, list[float]] = {name: [] for name in CALLS}
    lat_scan, lat_store, lat_done, lat_step = (lat[name] for name in CALLS)
    inflight: dict[str, tuple[ReqContext, int, list[bytes], list[bytes]]] = {}
    excluded = 0.0  # caller-side ReqContext construction and key positions
    perf = time.perf_counter
    gc.disable()
    cpu0 = time.process_time()
    t0 = perf()
    for i, (kind, req_id, keys) in enumerate(events):
        if kind == "start":
            te = perf()
            ctx = ReqContext(req_id)
            if positions:
                setpos = ctx.set_offload_key_position
                end = 0
                for key in keys:
                    end += block_tokens
                    setpos(key, end)
            excluded += perf() - te
            on_new_request(ctx)
            # Prefix scan as vLLM's scheduler does it (_maximal_prefix_lookup) and
            # as kvtiers' lookup_prefix does: go on through HIT_PENDING / RETRY
            # until the first MISS; the hits are the leading readable blocks.
            t = perf()
            n = 0
            leading = True
            for key in keys:
                r = lookup(key, ctx)
                if r is HIT:
                    if leading:
                        n += 1
                    continue
                if r is MISS:
                    break
                leading = False
            lat_scan.append(perf() - t)
            ops += min(n + 1, len(keys))
            prompt_blocks += len(keys)
            hits_blocks += n
            loads = keys[:n]
            if n:
                prepare_load(loads, ctx)
                touch(loads, ctx)
                ops += 2 * n
            new = keys[n:]
            t = perf()
            out = prepare_store(new, ctx)
            lat_store.append(perf() - t)
            ops += len(new)
            if out is None:
                refused += 1
                stored = []
            else:
                stored = out.keys_to_store
            inflight[req_id] = (ctx, len(keys), loads, stored)
        else:
            ctx, nprompt, loads, stored = inflight.pop(req_id)
            if positions and keys:
                te = perf()
                setpos = ctx.set_offload_key_position
                end = nprompt * block_tokens
                for key in keys:
                    end += block_tokens
                    setpos(key, end)
                excluded += perf() - te
            if loads:
                complete_load(loads, ctx)
                ops += len(loads)
            if stored:
                t = perf()
                complete_store(stored, ctx)
                lat_done.append(perf() - t)
                ops += len(stored)
                inserted += len(stored)
            if keys:
                t = perf()
                out = prepare_store(keys, ctx)
                lat_store.append(perf() - t)
                ops += len(keys)
                if out is None:
                    refused += 1
                elif out.keys_to_store:
                    t = perf()
                    complete_store(out.keys_to_store, ctx)
                    lat_done.append(perf() - t)
                    ops += len(out.keys_to_store)
                    inserted += len(out.keys_to_store)
            on_request_finished(ctx)
        if i % 64 == 0:
            t = perf()
            on_schedule_end(step_ctx)
            lat_step.append(perf() - t)
    elapsed = perf() - t0 - excluded
    cpu = time.process_time() - cpu0 - excluded
    # The last request's context (and the state vLLM hangs on it) is the caller's
    # and would be gone in an engine: drop it before the heap is measured.
    ctx = setpos = None
    gc.enable()
    if inflight:
        raise RuntimeError(f"trace ended with {len(inflight)} requests unfinished")
    # Every store completed successfully, so a block stored is either resident or
    # was evicted. (Private fields: vLLM exposes no resident count.)
    resident = mgr._num_allocated_chunks - len(mgr._free_list)
    pol = mgr._policy
    held = len(pol.chunks) if hasattr(pol, "chunks") else len(pol.t1) + len(pol.t2)
    assert resident == held, (resident, held)
    result = {
        "system": SYSTEM,
        "policy": policy,
        "ops": ops,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "ops_per_s": ops / elapsed,
        "ops_per_cpu_s": ops / cpu,
        "hit_rate": hits_blocks / max(1, prompt_blocks),
        "resident_blocks": resident,
        "evictions": inserted - resident,
        "prepare_store_p50_us": statistics.median(lat_store) * 1e6,
        "prepare_store_p99_us": statistics.quantiles(lat_store, n=100)[98] * 1e6,
        "latency": percentiles(lat),
        "store_refused": refused,
        "excluded_caller_seconds": excluded,
    }
    if measure_memory:
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        # Count only memory allocated by vLLM's own code (manager, policy, request
        # state it hangs on ReqContext); the keys were made before tracing began.
        vllm_dir = os.path.dirname(os.path.abspath(vllm.__file__))
        filt = [tracemalloc.Filter(True, os.path.join(vllm_dir, "*"))]
        stats = snap.filter_traces(filt).statistics("filename")
        held = sum(s.size for s in stats)
        result["heap_bytes"] = held
        result["heap_bytes_per_resident_block"] = held / max(1, resident)
        result["heap_by_file"] = {
            os.path.relpath(s.traceback[0].filename, vllm_dir): s.size for s in stats[:8]
        }
    mgr.shutdown()
    return result


def serve(events: list[tuple[str, str, list[bytes]]], slots: int, **kw: Any) -> int:
    """The other half of manager_replay.py's interleaved runs: one JSON request per
    line on stdin (`{"policy": "lru", "memory": false}`), one JSON result per line on
    stdout, until stdin closes. The trace is loaded once."""
    print(json.dumps({"ready": True, "vllm": vllm.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        res = replay(events, slots, policy=req.get("policy", POLICY),
                     measure_memory=bool(req.get("memory")), **kw)
        print(json.dumps(res), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("trace", type=Path, help="event stream written by manager_replay.py --trace")
    ap.add_argument("--slots", type=int, default=100_000, help="CPU pool blocks (default 100000)")
    ap.add_argument("--policy", default=POLICY,
                    help="vLLM cache policy name(s), comma-separated (lru, arc)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs; the median is reported")
    ap.add_argument("--block-tokens", type=int, default=16,
                    help="tokens per block, for the key positions (default 16)")
    ap.add_argument("--no-positions", action="store_true",
                    help="do not record key positions on the ReqContext (vLLM's "
                         "scheduler always does; its LRU then ranks blocks by call order)")
    ap.add_argument("--serve", action="store_true",
                    help="run replays on request (stdin/stdout JSON lines) for "
                         "manager_replay.py --vllm-python")
    ap.add_argument("--json", type=Path, help="write results here")
    args = ap.parse_args()

    t = time.perf_counter()
    events, info = load_trace(args.trace)
    print(f"trace: {info['requests']} requests, {info['distinct_keys']} distinct keys, "
          f"loaded in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    kw: dict[str, Any] = {"positions": not args.no_positions, "block_tokens": args.block_tokens}
    if args.serve:
        return serve(events, args.slots, **kw)
    results = []
    for policy in args.policy.split(","):
        runs = [replay(events, args.slots, policy=policy, **kw) for _ in range(args.runs)]
        mem = replay(events, args.slots, policy=policy, measure_memory=True, **kw)
        best = sorted(runs, key=lambda r: r["ops_per_s"])[len(runs) // 2]
        best["runs_ops_per_s"] = [r["ops_per_s"] for r in runs]
        best["heap_bytes_per_resident_block"] = mem["heap_bytes_per_resident_block"]
        best["heap_bytes"] = mem["heap_bytes"]
        best["heap_by_file"] = mem["heap_by_file"]
        best["key_positions"] = not args.no_positions
        results.append(best)
    w = max(10, len(SYSTEM))
    print(f"{'system':{w}} {'policy':7} {'Mops/s':>7} {'hit%':>6} {'B/blk':>6} "
          f"{'p50 us':>7} {'p99 us':>7}")
    for r in results:
        print(f"{r['system']:{w}} {r['policy']:7} {r['ops_per_s'] / 1e6:7.2f} "
              f"{100 * r['hit_rate']:6.1f} {r['heap_bytes_per_resident_block']:6.0f} "
              f"{r['prepare_store_p50_us']:7.1f} {r['prepare_store_p99_us']:7.1f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": platform.node(), "python": platform.python_version(),
            "vllm": vllm.__version__, "spec": info, "slots": args.slots,
            "results": results,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
