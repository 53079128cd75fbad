#!/usr/bin/env python3
"""DeviceSwapper throughput: GPU <-> CPU pool, by layout and copy method, against the
machine's own ceiling measured in the same run; matmul slowdown while transfers run;
and, without CUDA, the CPU stand-in against a plain `copy_` of the same bytes.

    PYTHONPATH=kvtiers-core/src python bench/swap_bench.py \
        --json bench/results/swap_h200.json                                # an H200
    .venv/bin/python bench/swap_bench.py --cpu --json bench/results/swap_cpu.json

Workloads (Llama-3-8B-like: 32 layers, 8 kv heads, head size 128, bf16, 16-token
pages, so one block = 2 MiB):
- `cross`: one cross-layer tensor, a block is one contiguous 2 MiB run;
- `layer`: one `[2, pages, 16, 8, 128]` tensor per layer, a block is 64 fragments
  of 32 KiB.
Pages and slots are random permutations (no accidental coalescing). Throughput is
bytes over wall time from the first submit to the last completion, several jobs in
flight, median of `--runs`. The ceiling is one pinned `copy_` of a large buffer
(the same pool memory) per direction.
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

import numpy as np
import torch
from kvtiers.swap import DeviceSwapper, KVLayout

MiB = 1 << 20
GiB = 1 << 30
LAYERS, HEADS, HEAD, TOKENS = 32, 8, 128, 16
PAGE_BYTES = TOKENS * HEADS * HEAD * 2  # 32 KiB
BLOCK_BYTES = LAYERS * 2 * PAGE_BYTES  # 2 MiB


def log(*a: object) -> None:
    print(*a, flush=True)


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


# ----------------------------------------------------------------------------- setup


def make_kv(kind: str, pages: int, device: str) -> tuple[KVLayout, list[torch.Tensor]]:
    if kind == "cross":
        t = torch.empty(pages, LAYERS, 2, TOKENS, HEADS, HEAD, dtype=torch.bfloat16, device=device)
        return KVLayout.cross_layer(t), [t]
    ts = [
        torch.empty(2, pages, TOKENS, HEADS, HEAD, dtype=torch.bfloat16, device=device)
        for _ in range(LAYERS)
    ]
    return KVLayout.per_layer(ts), ts


def fill(ts: list[torch.Tensor]) -> None:
    for t in ts:
        t.view(torch.int16).random_(1, 1 << 15)


class Runner:
    """Submits jobs of random pages/slots and times them."""

    def __init__(self, swap: DeviceSwapper, pages: int, slots: int, seed: int = 0):
        self.swap = swap
        self.pages = pages
        self.slots = slots
        self.rng = np.random.default_rng(seed)
        self.next_id = 0
        self.submit_seconds = 0.0  # host time inside submit_* calls
        self.submitted = 0
        # GB/s of each job over its own GPU time (its start and end events)
        self.job_rates: dict[str, list[float]] = {}

    def submit(
        self, direction: str, job_id: int, pages: np.ndarray, slots: np.ndarray,
        method: str | None,
    ) -> None:  # fmt: skip
        t0 = time.perf_counter()
        if direction == "store":
            self.swap.submit_store(job_id, pages, slots, method=method)
        else:
            self.swap.submit_load(job_id, slots, pages, method=method)
        self.submit_seconds += time.perf_counter() - t0
        self.submitted += 1

    def submit_us(self) -> float:
        """Mean host time of one submit call (planning + queueing), microseconds."""
        us = self.submit_seconds / max(1, self.submitted) * 1e6
        self.submit_seconds, self.submitted = 0.0, 0
        return us

    def job(
        self, blocks: int, page_range: tuple[int, int], slot_range: tuple[int, int]
    ) -> tuple[int, np.ndarray, np.ndarray]:
        p = page_range[0] + self.rng.permutation(page_range[1] - page_range[0])[:blocks]
        s = slot_range[0] + self.rng.permutation(slot_range[1] - slot_range[0])[:blocks]
        self.next_id += 1
        return self.next_id, p, s

    def timed(
        self, direction: str, jobs: int, blocks: int, method: str | None,
        **ranges: tuple[int, int],
    ) -> float:  # fmt: skip
        """Bytes/s of `jobs` jobs of `blocks` blocks, all in flight together."""
        page_range = ranges.get("pages", (0, self.pages))
        slot_range = ranges.get("slots", (0, self.slots))
        specs = [self.job(blocks, page_range, slot_range) for _ in range(jobs)]
        if self.swap.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for job_id, p, s in specs:
            self.submit(direction, job_id, p, s, method)
        self.swap.wait([j for j, _, _ in specs])
        dt = time.perf_counter() - t0
        results = self.swap.get_finished()
        bad = [r for r in results if not r.success]
        if bad:
            raise RuntimeError(f"{len(bad)} jobs failed: {bad[0].error}")
        for r in results:
            self.job_rates.setdefault(f"{r.direction}_alone", []).append(r.bytes_moved / r.seconds)
        return sum(r.bytes_moved for r in results) / dt

    def both(
        self, jobs: int, blocks: int, method: str | None, half_pages: int, half_slots: int
    ) -> float:
        """Bytes/s of stores and loads in flight together (disjoint pages and slots)."""
        stores = [self.job(blocks, (0, half_pages), (0, half_slots)) for _ in range(jobs)]
        loads = [
            self.job(blocks, (half_pages, self.pages), (half_slots, self.slots))
            for _ in range(jobs)
        ]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for (js, ps, ss), (jl, pl, sl) in zip(stores, loads, strict=True):
            self.submit("store", js, ps, ss, method)
            self.submit("load", jl, pl, sl, method)
        self.swap.wait([j for j, _, _ in stores + loads])
        dt = time.perf_counter() - t0
        results = self.swap.get_finished()
        assert all(r.success for r in results), [r.error for r in results if not r.success][:1]
        for r in results:  # GPU time of each job, from its start to its end event
            self.job_rates.setdefault(r.direction, []).append(r.bytes_moved / r.seconds)
        return sum(r.bytes_moved for r in results) / dt


# ----------------------------------------------------------------------------- CUDA


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "machine": platform.node(),
        "cpus": os.cpu_count(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda)
        env["gpu_mem_gib"] = round(p.total_memory / GiB, 1)
        from kvtiers.swap.cuda_driver import CudaDriver

        d = CudaDriver(0)
        env.update(driver_version=d.driver_version, cuMemcpyBatchAsync=d.batch_available)
    for mod in ("triton", "cuda.bindings", "cupy"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            env[mod] = getattr(m, "__version__", "present")
        except Exception as e:  # noqa: BLE001 - any import failure: the module is missing
            env[mod] = f"missing ({type(e).__name__})"
    return env


def ceiling(pool_t: torch.Tensor, nbytes: int, runs: int) -> dict[str, float]:
    flat = pool_t.view(-1)[:nbytes]
    gpu = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    gpu2 = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    # torch's stubs leave Stream.__new__ and Event.__new__ untyped (the ignores below)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()  # type: ignore[no-untyped-call]
    out = {}
    copies: tuple[tuple[str, Callable[[], object]], ...] = (
        ("h2d", lambda: gpu.copy_(flat, non_blocking=True)),
        ("d2h", lambda: flat.copy_(gpu, non_blocking=True)),
    )
    for name, fn in copies:
        xs = []
        for _ in range(runs):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.cuda.stream(s1):
                fn()
            s1.synchronize()
            xs.append(nbytes / (time.perf_counter() - t0))
        out[name] = median(xs)
    half = nbytes // 2
    xs = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(s1):
            gpu[:half].copy_(flat[:half], non_blocking=True)
        with torch.cuda.stream(s2):
            flat[half:].copy_(gpu2[half:], non_blocking=True)
        s1.synchronize()
        s2.synchronize()
        xs.append(nbytes / (time.perf_counter() - t0))
    out["both"] = median(xs)
    return out


class Matmul:
    """A loop of bf16 `n x n` matmuls queued on the default stream, timed by events."""

    def __init__(self, n: int, iters: int):
        self.a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        self.b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        self.c = torch.empty(n, n, dtype=torch.bfloat16, device="cuda")
        self.iters = iters
        self.flops = 2.0 * n**3 * iters

    def launch(self) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(self.iters):
            torch.matmul(self.a, self.b, out=self.c)
        end.record()
        return start, end

    def rate(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        ms: float = start.elapsed_time(end)
        return self.flops / (ms / 1e3)


def loaded_rate(swap: DeviceSwapper, runner: Runner, mm: Matmul, method: str | None,
                blocks: int, pages: int, slots: int) -> tuple[float, float]:  # fmt: skip
    """One matmul loop with stores and loads running the whole time: (matmul
    FLOP/s, transfer bytes/s during the loop)."""
    torch.cuda.synchronize()
    start, end = mm.launch()
    moved = 0
    t0 = time.perf_counter()
    inflight: set[int] = set()
    half_p, half_s = pages // 2, slots // 2
    # 128 blocks in flight whatever the job size (4 jobs of 32 blocks left small jobs
    # waiting on this loop's polling rather than on the link).
    depth = max(4, 128 // max(1, blocks))
    while not end.query():  # type: ignore[no-untyped-call]
        while len(inflight) < depth:
            js, ps, ss = runner.job(blocks, (0, half_p), (0, half_s))
            jl, pl, sl = runner.job(blocks, (half_p, pages), (half_s, slots))
            runner.submit("store", js, ps, ss, method)
            runner.submit("load", jl, pl, sl, method)
            inflight |= {js, jl}
        for r in swap.get_finished():
            inflight.discard(r.job_id)
            moved += r.bytes_moved
        time.sleep(0.0002)
    window = time.perf_counter() - t0
    rate = mm.rate(start, end)
    swap.wait(list(inflight))
    swap.get_finished()
    return rate, moved / max(window, 1e-9)


def slowdown(swap: DeviceSwapper, runner: Runner, mm: Matmul, method: str | None,
             blocks: int, pages: int, slots: int, pairs: int) -> dict[str, float]:  # fmt: skip
    """Matmul throughput with transfers vs alone, measured in alternation (so clock
    and thermal drift hit both alike), medians of `pairs`."""
    alone, loaded, moved = [], [], []
    for _ in range(pairs):
        torch.cuda.synchronize()
        alone.append(mm.rate(*mm.launch()))
        rate, gbps = loaded_rate(swap, runner, mm, method, blocks, pages, slots)
        loaded.append(rate)
        moved.append(gbps)
    a, b = median(alone), median(loaded)
    return {
        "matmul_tflops_alone": a / 1e12,
        "matmul_tflops": b / 1e12,
        "matmul_slowdown": 1.0 - b / a,
        "transfer_gbps_during": median(moved) / 1e9,
    }


def cuda_bench(args: argparse.Namespace) -> dict[str, Any]:
    from kvtiers.pool import CpuPool

    runs = args.runs
    pages = args.pages
    slots = args.pages
    blocks = args.blocks
    jobs = args.jobs
    out: dict[str, Any] = {"environment": environment(), "rows": [], "curve": []}
    log("environment:", json.dumps(out["environment"]))
    t0 = time.perf_counter()
    pool = CpuPool(BLOCK_BYTES, slots * BLOCK_BYTES, pin=True)
    log(f"pool: {pool} pinned in {time.perf_counter() - t0:.1f}s")
    pool_t = pool.tensor()
    ceil = ceiling(pool_t, min(pool.nbytes, 1 * GiB), runs)
    out["ceiling_gbps"] = {k: v / 1e9 for k, v in ceil.items()}
    log(f"ceiling: H2D {ceil['h2d'] / 1e9:.1f} GB/s, D2H {ceil['d2h'] / 1e9:.1f} GB/s, "
        f"both {ceil['both'] / 1e9:.1f} GB/s")  # fmt: skip

    grids = [int(g) for g in args.grids.split(",")]
    staged_grids = [int(g) if g != "default" else None for g in args.staged_grids.split(",")]
    n_mm = args.matmul_n
    mm = Matmul(n_mm, args.matmul_iters)
    warm = time.perf_counter()
    while time.perf_counter() - warm < 2.0:  # clocks up before anything is measured
        mm.rate(*mm.launch())
    base = median([mm.rate(*mm.launch()) for _ in range(4)])
    out["matmul"] = {"n": n_mm, "iters": args.matmul_iters, "tflops_alone": base / 1e12}
    log(f"matmul {n_mm}^3 bf16 alone: {base / 1e12:.0f} TFLOP/s")

    def row(
        layout_name: str,
        method: str,
        grid: int | None,
        direction: str,
        gbps: float,
        extra: dict[str, Any] | None = None,
    ) -> None:
        ref = {"store": ceil["d2h"], "load": ceil["h2d"]}.get(direction)
        r = {"layout": layout_name, "method": method, "grid": grid, "direction": direction,
             "gbps": gbps / 1e9, "ratio": gbps / ref if ref else None}  # fmt: skip
        r.update(extra or {})
        out["rows"].append(r)
        ratio = f"{r['ratio'] * 100:5.1f}%" if r["ratio"] else "      "
        per_job = (extra or {}).get("job_blocks", "")
        name = f"{layout_name:6s} {method:7s} grid={grid!s:>4s} x{per_job!s:>3s} {direction:5s}"
        log(f"  {name} {gbps / 1e9:6.1f} GB/s {ratio}")

    def measure(
        layout: KVLayout,
        kind: str,
        method: str,
        grid: int | None,
        job_blocks: int = blocks,
        note: str = "",
        dma_flags: int | None = None,
        **kw: Any,
    ) -> None:
        fixed = None if method == "auto" else method
        if grid is not None:
            kw["kernel_grid" if method == "kernel" else "staged_grid"] = grid
        with DeviceSwapper(layout, pool, method=method, wait_for_compute=False, **kw) as swap:
            if dma_flags is not None:
                swap._backend._opt.dma_flags = dma_flags  # diagnostics only
            runner = Runner(swap, pages, slots)
            runner.timed("store", 1, 4, fixed)  # warm-up (Triton compiles here)
            runner.timed("load", 1, 4, fixed)
            runner.submit_us()
            runner.job_rates.clear()
            n_jobs = max(jobs, jobs * blocks // job_blocks)  # the same bytes per measurement
            res: dict[str, float] = {}
            for direction in ("store", "load"):
                res[direction] = median(
                    [runner.timed(direction, n_jobs, job_blocks, fixed) for _ in range(runs)]
                )
            submit_us = runner.submit_us()
            # Stores and loads of `job_blocks` blocks each (results before 2026-12-01 used
            # jobs of half that size here: 64 for the 128-block rows, 8 for the small).
            both = median(
                [
                    runner.both(n_jobs // 2 or 1, job_blocks, fixed, pages // 2, slots // 2)
                    for _ in range(runs)
                ]
            )
            gpu_rate = {d: median(v) / 1e9 for d, v in runner.job_rates.items()}
            extra: dict[str, Any] = {
                "job_blocks": job_blocks, "submit_us": submit_us,
                "submit_us_per_block": submit_us / job_blocks, "note": note,
            }  # fmt: skip
            extra["job_gpu_gbps"] = gpu_rate
            if method == "auto":
                extra["chose"] = sorted(swap.stats().methods)
            for direction in ("store", "load"):
                row(kind, method, grid, direction, res[direction], extra)
            row(kind, method, grid, "both", both, extra)
            log(
                f"      {note} submit {submit_us:.0f} us/job of {job_blocks} blocks; per-job GPU"
                " GB/s: " + ", ".join(f"{d} {v:.1f}" for d, v in sorted(gpu_rate.items()))
            )
            if args.no_matmul or (job_blocks != blocks and not args.small_only) or note:
                return
            mm_blocks = job_blocks if args.small_only else blocks // 4
            sd = slowdown(swap, runner, mm, fixed, mm_blocks, pages, slots, args.pairs)
            log(
                f"      with matmul: {sd['matmul_tflops']:.0f} vs {sd['matmul_tflops_alone']:.0f}"
                f" TFLOP/s alone, slowdown {sd['matmul_slowdown'] * 100:5.1f}%, transfers "
                f"{sd['transfer_gbps_during']:.1f} GB/s during"
            )
            out["curve"].append(
                {
                    "layout": kind, "method": method, "grid": grid, **extra,
                    "store_gbps": res["store"] / 1e9, "load_gbps": res["load"] / 1e9,
                    "both_gbps": both / 1e9, **sd,
                }
            )  # fmt: skip

    for kind in ("cross", "layer"):
        layout, ts = make_kv(kind, pages, "cuda")
        fill(ts)
        log(f"{kind}: {layout.describe()}")
        configs: list[tuple[str, int | None, int, dict[str, Any]]] = [("dma", None, blocks, {})]
        if args.small_only:  # the small-job rows: small jobs, the default method
            configs = [("auto", None, args.small_job, {})]
            if kind == "layer":
                configs.append(("staged", None, args.small_job, {}))
        elif kind == "layer":
            configs += [("staged", g, blocks, {}) for g in staged_grids]
            configs += [("kernel", g, blocks, {}) for g in grids]
        else:
            configs.append(("kernel", args.kernel_grid, blocks, {}))
        if not args.small_only:
            configs += [("auto", None, blocks, {}), ("auto", None, args.small_job, {})]
        if args.diagnose:  # what limits stores and loads running together
            configs += [
                ("dma", None, blocks, {"note": "dma_flags=0", "dma_flags": 0}),
                ("auto", None, blocks, {"note": "staging=256MiB", "staging_bytes": 256 * MiB}),
                ("auto", None, blocks, {"note": "staging=16MiB", "staging_bytes": 16 * MiB}),
            ]
        for method, grid, job_blocks, kw in configs:
            try:
                measure(layout, kind, method, grid, job_blocks, **kw)
            except Exception as e:  # noqa: BLE001 - report, go on with the other methods
                log(f"  {kind} {method} grid={grid}: FAILED {type(e).__name__}: {e}")
                out.setdefault("errors", []).append(f"{kind} {method} {grid}: {e!r}")
        del ts, layout
        torch.cuda.empty_cache()
    pool.close()
    return out


# ----------------------------------------------------------------------------- CPU


def cpu_bench(args: argparse.Namespace) -> dict[str, Any]:
    runs = args.runs
    pages = args.cpu_pages
    blocks = pages // 2
    out: dict[str, Any] = {"environment": environment(), "rows": []}
    nbytes = blocks * BLOCK_BYTES
    a = torch.empty(nbytes, dtype=torch.uint8)
    b = torch.empty(nbytes, dtype=torch.uint8)
    a.random_(1, 255)
    b.zero_()

    def copy_rate() -> float:
        t0 = time.perf_counter()
        b.copy_(a)
        rate: float = nbytes / (time.perf_counter() - t0)
        # torch's OpenMP threads spin a while after a parallel copy_; let them sleep
        # before the swapper's threads (numpy, one core each) are timed.
        time.sleep(0.05)
        return rate

    for kind in ("cross", "layer"):
        layout, ts = make_kv(kind, pages, "cpu")
        fill(ts)
        pool = torch.zeros(pages, BLOCK_BYTES, dtype=torch.uint8)
        with DeviceSwapper(layout, pool) as swap:
            runner = Runner(swap, pages, pages)
            for direction in ("store", "load"):  # warm-up: threads, buffers, page faults
                runner.timed(direction, 1, blocks, None)
            for direction in ("store", "load"):
                xs, cs = [], []
                for _ in range(runs):  # alternate, so both see the same machine load
                    cs.append(copy_rate())
                    xs.append(runner.timed(direction, 1, blocks, None))
                swap_rate, plain = median(xs), median(cs)
                r = {"layout": kind, "direction": direction, "gbps": swap_rate / 1e9,
                     "copy_gbps": plain / 1e9, "ratio_vs_copy": swap_rate / plain}  # fmt: skip
                out["rows"].append(r)
                log(f"  cpu {kind:6s} {direction:5s} {swap_rate / 1e9:6.2f} GB/s, plain copy_ "
                    f"{plain / 1e9:6.2f} GB/s: {swap_rate / plain * 100:5.1f}%")  # fmt: skip
        del ts, layout, pool
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cpu", action="store_true", help="benchmark the CPU stand-in")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pages", type=int, default=1024, help="GPU pages and pool slots (2 MiB each)")
    ap.add_argument("--blocks", type=int, default=128, help="blocks per job")
    ap.add_argument("--jobs", type=int, default=4, help="jobs in flight per measurement")
    ap.add_argument("--grids", default="2,4,8,16,32,64", help="kernel grids for the curve")
    ap.add_argument("--kernel-grid", type=int, default=8)
    ap.add_argument("--staged-grids", default="default,132,33", help="staged kernel grids")
    ap.add_argument("--small-job", type=int, default=16, help="blocks per job, small-job rows")
    ap.add_argument("--small-only", action="store_true",
                    help="only the small-job rows (with their own matmul check)")  # fmt: skip
    ap.add_argument("--label", default="", help="a name for this run in the JSON")
    ap.add_argument("--pairs", type=int, default=3, help="alone/loaded matmul pairs")
    ap.add_argument("--diagnose", action="store_true", help="extra configurations")
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--matmul-iters", type=int, default=60)
    ap.add_argument("--no-matmul", action="store_true")
    ap.add_argument("--cpu-pages", type=int, default=64)
    args = ap.parse_args()
    if args.cpu or not torch.cuda.is_available():
        result = {"kind": "cpu", **cpu_bench(args)}
    else:
        result = {"kind": "cuda", **cuda_bench(args)}
    result["args"] = {k: str(v) for k, v in vars(args).items()}
    import kvtiers.swap

    result["kvtiers_swap_path"] = str(Path(kvtiers.swap.__file__).parent)
    result["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        log(f"wrote {args.json}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
