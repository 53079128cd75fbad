#!/usr/bin/env python3
"""Where a small swapper job's host time goes (diagnostics for small jobs).

    PYTHONPATH=kvtiers-core/src python bench/swap_profile.py [--json out.json]

Prints the mean host time of `submit_store`/`submit_load` for 16-block jobs (cross-
layer `dma`, per-layer `staged`), a cProfile of those submits, and the host cost of
the primitives a submit is made of (events, stream switches, one batched DMA call,
one copy-kernel launch, one result). Needs CUDA.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kvtiers.pool import CpuPool
from kvtiers.swap import DeviceSwapper, KVLayout

LAYERS, HEADS, HEAD, TOKENS = 32, 8, 128, 16
BLOCK_BYTES = LAYERS * 2 * TOKENS * HEADS * HEAD * 2


def us(fn: Callable[[], object], n: int = 2000) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def make(kind: str, pages: int) -> KVLayout:
    if kind == "cross":
        t = torch.empty(pages, LAYERS, 2, TOKENS, HEADS, HEAD, dtype=torch.bfloat16, device="cuda")
        return KVLayout.cross_layer(t)
    ts = [torch.empty(2, pages, TOKENS, HEADS, HEAD, dtype=torch.bfloat16, device="cuda")
          for _ in range(LAYERS)]  # fmt: skip
    return KVLayout.per_layer(ts)


def submits(
    swap: DeviceSwapper, pages: int, blocks: int, jobs: int, prof: bool
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    specs = [
        (rng.permutation(pages)[:blocks], rng.permutation(pages)[:blocks]) for _ in range(jobs)
    ]
    out: dict[str, Any] = {}
    for direction in ("store", "load"):
        pr = cProfile.Profile() if prof else None
        spent = 0.0
        finish = 0.0
        for i, (pg, sl) in enumerate(specs):
            t0 = time.perf_counter()
            if pr:
                pr.enable()
            if direction == "store":
                swap.submit_store(i, pg, sl)
            else:
                swap.submit_load(i, sl, pg)
            if pr:
                pr.disable()
            spent += time.perf_counter() - t0
            if i % 8 == 7:
                swap.wait(range(i - 7, i + 1))
                t1 = time.perf_counter()
                swap.get_finished()
                finish += time.perf_counter() - t1
        swap.wait(range(jobs))
        swap.get_finished()
        out[direction] = {"submit_us": spent / jobs * 1e6, "finish_us": finish / jobs * 1e6}
        if pr:
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
            out[direction]["profile"] = s.getvalue()
    return out


def primitives(swap: DeviceSwapper) -> dict[str, float]:
    be = swap._backend
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    cur = torch.cuda.current_stream()
    ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    res: dict[str, float] = {}
    res["event_create"] = us(lambda: torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
    res["event_record"] = us(lambda: ev.record(stream))
    res["event_query"] = us(lambda: ev.query())  # type: ignore[no-untyped-call]
    res["current_stream"] = us(lambda: torch.cuda.current_stream())

    def ctx() -> None:
        with torch.cuda.stream(stream):
            pass

    res["stream_ctx"] = us(ctx)
    res["wait_stream"] = us(lambda: stream.wait_stream(cur))
    drv = be._driver
    res["ensure_context"] = us(drv.ensure_context)
    n = 16
    dev = torch.empty(n * 4096, dtype=torch.uint8, device="cuda")
    host = torch.empty(n * 4096, dtype=torch.uint8, pin_memory=True)
    d = (dev.data_ptr() + np.arange(n, dtype=np.uint64) * 4096).astype(np.uint64)
    h = (host.data_ptr() + np.arange(n, dtype=np.uint64) * 4096).astype(np.uint64)
    sz = np.full(n, 4096, np.uint64)
    cs = stream.cuda_stream
    res["memcpy_batch_16"] = us(lambda: drv.memcpy_batch(h, d, sz, cs, to_host=True), 500)
    stream.synchronize()
    n = 1024
    dev2 = torch.empty(n * 4096, dtype=torch.uint8, device="cuda")
    host2 = torch.empty(n * 4096, dtype=torch.uint8, pin_memory=True)
    d2 = (dev2.data_ptr() + np.arange(n, dtype=np.uint64) * 4096).astype(np.uint64)
    h2 = (host2.data_ptr() + np.arange(n, dtype=np.uint64) * 4096).astype(np.uint64)
    sz2 = np.full(n, 4096, np.uint64)
    res["memcpy_batch_1024"] = us(lambda: drv.memcpy_batch(h2, d2, sz2, cs, to_host=True), 100)
    stream.synchronize()
    def loop() -> None:
        for i in range(16):
            host[i * 4096 : (i + 1) * 4096].copy_(dev[i * 4096 : (i + 1) * 4096], non_blocking=True)

    res["copy__16x4k_loop_per_copy"] = us(loop, 100) / 16
    torch.cuda.synchronize()
    res["kernel"] = type(be._kernel).__name__ if hasattr(be, "_kernel") else "triton"  # type: ignore[assignment]
    try:
        from kvtiers.swap.triton_copy import launch_copy

        a = torch.empty(n * 4096, dtype=torch.uint8, device="cuda")
        b = torch.empty(n * 4096, dtype=torch.uint8, device="cuda")
        table = np.empty((3, 1024), np.int64)
        table[0] = a.data_ptr() + np.arange(1024) * 4096
        table[1] = b.data_ptr() + np.arange(1024) * 4096
        table[2] = 512
        buf, addr = be._tables.take(table.size)
        with torch.cuda.stream(stream):
            res["triton_launch_1024"] = us(lambda: launch_copy(table, 528, buf, addr), 300)
        stream.synchronize()
    except Exception as e:  # noqa: BLE001 - the new backend may not have it
        res["triton_error"] = repr(e)  # type: ignore[assignment]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--pages", type=int, default=256)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    pool = CpuPool(BLOCK_BYTES, args.pages * BLOCK_BYTES, pin=True)
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0)}
    for kind, method in (("cross", "dma"), ("layer", "staged")):
        layout = make(kind, args.pages)
        for wfc in (False, True):
            with DeviceSwapper(layout, pool, method=method, wait_for_compute=wfc) as swap:
                submits(swap, args.pages, 4, 8, False)  # warm-up, compiles
                key = f"{kind}_{method}_wfc{int(wfc)}"
                prof = not args.no_profile and wfc
                out[key] = submits(swap, args.pages, args.blocks, args.jobs, prof)
                for d in ("store", "load"):
                    r = out[key][d]
                    print(f"{key:22s} {d:5s} submit {r['submit_us']:7.1f} us/job "
                          f"({r['submit_us'] / args.blocks:5.1f} us/block), "
                          f"get_finished {r['finish_us']:5.1f} us/job", flush=True)  # fmt: skip
                if kind == "layer" and wfc:
                    out["primitives"] = primitives(swap)
        del layout
        torch.cuda.empty_cache()
    for k, v in out["primitives"].items():
        print(f"  {k:22s} {v:8.2f} us" if isinstance(v, float) else f"  {k}: {v}")
    for key, v in out.items():
        if isinstance(v, dict):
            for d in ("store", "load"):
                if isinstance(v.get(d), dict) and "profile" in v[d]:
                    print(f"==== {key} {d}\n{v[d]['profile']}")
    pool.close()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
