#!/usr/bin/env python3
"""kvtiers-fs benchmark: the `fs` tier's store and load throughput against baselines
measured in the same run, on the same directory; load latency behind queued
stores; start-up time with a million blocks on disk.

    .venv/bin/python bench/fs_bench.py --dir /var/tmp/kvfs-bench
    .venv/bin/python bench/fs_bench.py --quick          # smaller, for a smoke run

Throughput rows (median of --runs runs; MB/s = 10^6 bytes/s of block bytes):

- fio: sequential write / read of 2 MiB blocks, O_DIRECT, libaio, iodepth 16,
  best of numjobs 1, 4 and 8 (the issue's yardstick; needs `fio` on PATH): into
  new files ("new files", fio's usual run), and again into the files just written
  ("overwrite": no block allocation, the like-for-like figure for a full tier);
- python-pwrite: a plain Python thread pool (as many threads as the tier) writing
  each block to its own new file with os.pwrite and reading it back with os.pread,
  O_DIRECT, no rename, no checksum, no index: the floor of a file per block;
- vllm-fs: vLLM 0.33's fs tier data path (its DualQueueThreadPool running its
  batch_store_block / batch_load_block, pure-Python, one task per job, as its
  FileSystemTierManager submits them), run in vLLM's own venv (--vllm-python);
- kvtiers-fs: the tier, from and to a page-aligned pool, verification on, with a
  capacity of exactly the blocks of one pass: a pass fills the empty tier ("filling
  an empty tier"), a second pass stores as many new blocks, each evicting one (the
  steady state of a cache, where evicted files are recycled: the store figure of
  the kvtiers-fs rows), and the blocks of the second pass are loaded; for
  o_direct auto (= on here) / off (buffered, files dropped from the page cache
  before loads, so reads are cold) and durable off / on.

Reads are cold: O_DIRECT, or buffered after POSIX_FADV_DONTNEED of every file.
Every row moves the same blocks: jobs of --job-blocks blocks, all submitted at once.
Every pass starts after os.sync(), and the order of the rows rotates from run to
run (on a shared virtual disk, what ran just before changes a pass's speed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

MiB = 1 << 20
O_DIRECT = getattr(os, "O_DIRECT", 0)
DEFAULT_VLLM_PYTHON = "/work/vllm-venv/bin/python"


# -- helpers usable in both venvs (no kvtiers imports) ---------------------------


def _fill(buf: Any, nbytes: int) -> Any:
    for off in range(0, nbytes, 64 * MiB):  # random bytes, never zeros
        n = min(64 * MiB, nbytes - off)
        buf[off : off + n] = os.urandom(n)
    return buf


def _pool(nbytes: int, huge: bool = True) -> Any:
    """A page-aligned buffer. `huge`: like kvtiers' anonymous CpuPool (private,
    transparent huge pages); else 4 KiB pages (what the pool was before it asked
    for huge pages, and what a buffer gets by default)."""
    import mmap

    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    buf.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    return _fill(buf, nbytes)


def _drop_cache(paths: list[str]) -> None:
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _files_under(d: Path, suffix: str) -> list[str]:
    return [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith(suffix)]


# -- vLLM's fs tier (runs in vLLM's venv) -----------------------------------------


def vllm_worker(args: argparse.Namespace) -> None:
    """One store pass and one load pass of vLLM's fs tier data path; prints JSON."""
    import functools
    import hashlib

    from vllm.v1.kv_offload.tiering.fs.io import (
        batch_load_block,
        batch_store_block,
        probe_o_direct,
    )
    from vllm.v1.kv_offload.tiering.fs.thread_pool import DualQueueThreadPool

    bb, n, per_job = args.block_bytes, args.blocks, args.job_blocks
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    buf = _pool(bb * n, huge=args.vllm_buffer == "huge")
    view = memoryview(buf)
    o_direct = probe_o_direct(str(root))
    names = [hashlib.sha256(f"{args.seed}-{i}".encode()).hexdigest() for i in range(n)]
    # FileMapper's shape: <root>/<hhh>/<hh>_g<group>/<hash>.bin
    paths = [str(root / h[:3] / f"{h[3:5]}_g0" / f"{h}.bin") for h in names]
    pool = DualQueueThreadPool(args.threads, args.threads, thread_name_prefix="bench")

    def run(load: bool) -> float:
        start = time.perf_counter()
        jobs = 0
        for j, first in enumerate(range(0, n, per_job)):
            idx = list(range(first, min(n, first + per_job)))
            task = functools.partial(
                batch_load_block if load else batch_store_block,
                [paths[i] for i in idx], view, [i * bb for i in idx], bb, o_direct)
            (pool.enqueue_load if load else pool.enqueue_store)(j, 1, [task])
            jobs += 1
        done = 0
        while done < jobs:
            for _, ok, _ in pool.get_finished():
                assert ok, "vLLM job failed"
                done += 1
            time.sleep(0.0002)
        return time.perf_counter() - start

    store_s = run(False)
    os.sync()
    _drop_cache(paths)
    load_s = run(True)
    pool.shutdown()
    print(json.dumps({"store_s": store_s, "load_s": load_s, "o_direct": o_direct}))


# -- kvtiers side ------------------------------------------------------------------


def _tier(root: Path, bb: int, slots: int, *, capacity: int, threads: int, **opts: Any) -> Any:
    from kvtiers.contract.namespace import BlockGeometry, Namespace
    from kvtiers.contract.tier import TierContext
    from kvtiers.pool import CpuPool
    from kvtiers_fs.tier import FsTier

    root.mkdir(parents=True, exist_ok=True)
    geometry = BlockGeometry(layers=1, kv_heads=1, head_size=bb // 2, dtype="uint8",
                             tokens_per_block=1)
    pool = CpuPool(bb, slots * bb, pin=False)  # the tier moves blocks from/to the pool
    _fill(pool.view.buffer, slots * bb)
    ctx = TierContext(pool.view, Namespace("bench/model", (geometry,)), name="fs-bench")
    tier = FsTier(ctx, {"root_dir": str(root), "capacity_bytes": capacity,
                        "threads": {"load": threads, "store": threads}, **opts})
    weakref.finalize(tier, pool.close)
    return tier


def _run_jobs(tier: Any, keys: list[bytes], per_job: int, load: bool) -> float:
    from kvtiers.contract.jobs import TransferJob

    start = time.perf_counter()
    ids = set()
    for j, first in enumerate(range(0, len(keys), per_job)):
        ks = keys[first : first + per_job]
        job = TransferJob(j + 1, ks, list(range(first, first + len(ks))))
        (tier.submit_load if load else tier.submit_store)(job)
        ids.add(job.job_id)
    while ids:
        for r in tier.get_finished_jobs():
            assert r.success, f"{'load' if load else 'store'} failed: {r.reasons()}"
            ids.discard(r.job_id)
        time.sleep(0.0002)
    return time.perf_counter() - start


def kvtiers_pass(d: Path, bb: int, n: int, per_job: int, threads: int,
                 **opts: Any) -> dict[str, float]:
    """Seconds to fill an empty tier with n blocks ("fill"), to store n more into the
    full tier, each evicting one ("store": the steady state of a cache, where
    evicted files are recycled), and to load those n blocks cold ("load")."""
    from kvtiers.contract.keys import make_key
    from kvtiers_fs.disk import layout

    tier = _tier(d, bb, n, capacity=n * layout.file_bytes(bb), threads=threads, **opts)
    try:
        out = {}
        for phase in ("fill", "store"):
            keys = [make_key(os.urandom(32)) for _ in range(n)]
            out[phase] = _run_jobs(tier, keys, per_job, load=False)
            os.sync()  # every pass of every row starts with nothing left to write back
        assert sum(s.recycled for s in tier.stores) == n, "the full tier did not recycle"
        if not all(tier.o_direct):
            _drop_cache(_files_under(d, ".kvb"))
        out["load"] = _run_jobs(tier, keys, per_job, load=True)
    finally:
        tier.close()
    return out


def python_pass(d: Path, bb: int, n: int, threads: int) -> tuple[float, float]:
    from concurrent.futures import ThreadPoolExecutor

    buf = _pool(bb * n)
    view = memoryview(buf)
    d.mkdir(parents=True, exist_ok=True)
    paths = [str(d / f"b{i:08d}") for i in range(n)]

    def write(i: int) -> None:
        fd = os.open(paths[i], os.O_WRONLY | os.O_CREAT | O_DIRECT, 0o600)
        try:
            os.pwrite(fd, view[i * bb : (i + 1) * bb], 0)
        finally:
            os.close(fd)

    def read(i: int) -> None:
        fd = os.open(paths[i], os.O_RDONLY | O_DIRECT)
        try:
            os.preadv(fd, [view[i * bb : (i + 1) * bb]], 0)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(threads) as ex:
        t0 = time.perf_counter()
        list(ex.map(write, range(n)))
        t1 = time.perf_counter()
        os.sync()
        t_sync = time.perf_counter()
        list(ex.map(read, range(n)))
        t2 = time.perf_counter()
    view.release()
    buf.close()
    return t1 - t0, t2 - t_sync


def fio_pass(d: Path, bb: int, total: int) -> dict[str, float]:
    """Best MB/s over numjobs 1, 4, 8 of: sequential write into new files ("write"),
    the same again into the files just written ("overwrite"), and a read."""
    best = {"write": 0.0, "overwrite": 0.0, "read": 0.0}
    for numjobs in (1, 4, 8):
        for what in ("write", "overwrite", "read"):
            rw = "write" if what == "overwrite" else what
            out = subprocess.run(
                ["fio", "--name=seq", f"--directory={d}", f"--rw={rw}", f"--bs={bb}",
                 f"--size={total // numjobs}", f"--numjobs={numjobs}", "--direct=1",
                 "--ioengine=libaio", "--iodepth=16", "--group_reporting",
                 "--output-format=json"],
                check=True, capture_output=True, text=True).stdout
            job = json.loads(out)["jobs"][0][rw]
            best[what] = max(best[what], job["bw_bytes"] / 1e6)
            os.sync()
        for f in d.iterdir():
            f.unlink()
    return best


def vllm_pass(args: argparse.Namespace, d: Path, bb: int, n: int,
              threads: int, buffer: str, per_job: int | None = None
              ) -> tuple[float, float] | None:
    py = args.vllm_python
    if not py or not os.path.exists(py):
        return None
    per_job = per_job or args.job_blocks_for[bb]
    out = subprocess.run(
        [py, __file__, "--vllm-worker", "--dir", str(d), "--block-bytes", str(bb),
         "--blocks", str(n), "--job-blocks", str(per_job),
         "--threads", str(threads), "--vllm-buffer", buffer],
        check=True, capture_output=True, text=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    return res["store_s"], res["load_s"]


FIO_NEW = "fio seq O_DIRECT libaio qd16, new files"
FIO_OVER = "fio seq O_DIRECT libaio qd16, overwrite"
KV_FILL = "kvtiers-fs O_DIRECT, filling an empty tier"
VLLM_ROWS = {"huge": "vllm-fs (pure Python)",
             "4k": "vllm-fs (pure Python), 4 KiB-page buffer"}


def throughput(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for bb, total in ((2 * MiB, args.bytes_2m), (64 << 10, args.bytes_64k)):
        rows += _throughput_of(args, base, bb, total)
    return rows


def _throughput_of(
    args: argparse.Namespace, base: Path, bb: int, total: int
) -> list[dict[str, Any]]:
    """Every pass, `args.runs` times, for blocks of `bb` bytes: one row per pass."""
    n = total // bb
    per_job = args.job_blocks_for[bb]
    samples: dict[str, list[tuple[float | None, float | None]]] = {}

    def add(name: str, store_s: float | None, load_s: float | None) -> None:
        samples.setdefault(name, []).append(
            (n * bb / store_s / 1e6 if store_s else None,
             n * bb / load_s / 1e6 if load_s else None))

    def python(d: Path) -> None:
        add("python-pwrite O_DIRECT", *python_pass(d, bb, n, args.threads))

    def vllm(buffer: str) -> Callable[[Path], None]:
        def one_pass(d: Path) -> None:
            got = vllm_pass(args, d, bb, n, args.threads, buffer)
            if got is not None:
                add(VLLM_ROWS[buffer], *got)
        return one_pass

    def kvtiers(name: str, **opts: Any) -> Callable[[Path], None]:
        def one_pass(d: Path) -> None:
            t = kvtiers_pass(d, bb, n, per_job, args.threads, **opts)
            add(name, t["store"], t["load"])
            if not opts:
                add(KV_FILL, t["fill"], None)
        return one_pass

    configs: list[tuple[str, Callable[[Path], None]]] = [
        ("python-pwrite", python),
        ("vllm-fs", vllm("huge")),
        ("vllm-fs 4k pages", vllm("4k")),
        ("kvtiers-fs O_DIRECT", kvtiers("kvtiers-fs O_DIRECT")),
        ("kvtiers-fs buffered", kvtiers("kvtiers-fs buffered", o_direct=False)),
        ("kvtiers-fs durable", kvtiers("kvtiers-fs O_DIRECT durable", durable=True)),
    ]
    for run in range(args.runs):
        if shutil.which("fio") and bb == 2 * MiB:
            d = base / "fio"
            d.mkdir(parents=True, exist_ok=True)
            best = fio_pass(d, bb, total)
            samples.setdefault(FIO_NEW, []).append((best["write"], best["read"]))
            samples.setdefault(FIO_OVER, []).append((best["overwrite"], None))
            shutil.rmtree(d)
        # Rotate the order every run: on a shared virtual disk, what ran just
        # before changes a pass's speed.
        k = run % len(configs)
        for name, fn in configs[k:] + configs[:k]:
            d = base / f"run{run}"
            try:
                fn(d)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            print(f"  {bb >> 10} KiB run {run}: {name} done", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    for name, vals in samples.items():
        stores = [v[0] for v in vals if v[0] is not None]
        loads = [v[1] for v in vals if v[1] is not None]
        rows.append({
            "block": f"{bb >> 10} KiB", "what": name, "blocks": n, "runs": len(vals),
            "store_MBps": round(statistics.median(stores), 1) if stores else None,
            "load_MBps": round(statistics.median(loads), 1) if loads else None,
            "store_all": [round(v, 1) for v in stores],
            "load_all": [round(v, 1) for v in loads],
        })
    return rows


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets for 2 MiB blocks, from the medians of one run."""
    by = {r["what"]: r for r in rows if r["block"] == "2048 KiB"}
    kv, out = by.get("kvtiers-fs O_DIRECT"), dict[str, Any]()
    if kv is None:
        return out
    fio_store = max((by[k]["store_MBps"] for k in (FIO_NEW, FIO_OVER) if k in by),
                    default=None)
    fio_load = by[FIO_NEW]["load_MBps"] if FIO_NEW in by else None
    vllm, vllm_4k = by.get(VLLM_ROWS["huge"]), by.get(VLLM_ROWS["4k"])
    if fio_store:
        out["store_vs_best_fio"] = round(kv["store_MBps"] / fio_store, 3)
    if fio_load:
        out["load_vs_fio"] = round(kv["load_MBps"] / fio_load, 3)
    if vllm:
        out["store_vs_vllm"] = round(kv["store_MBps"] / vllm["store_MBps"], 3)
        out["load_vs_vllm"] = round(kv["load_MBps"] / vllm["load_MBps"], 3)
    if vllm_4k:  # vLLM as the earlier runs measured it, before the pool's huge pages
        out["store_vs_vllm_4k_pages"] = round(kv["store_MBps"] / vllm_4k["store_MBps"], 3)
        out["load_vs_vllm_4k_pages"] = round(kv["load_MBps"] / vllm_4k["load_MBps"], 3)
    if KV_FILL in by and FIO_NEW in by:
        out["fill_vs_fio_new_files"] = round(
            by[KV_FILL]["store_MBps"] / by[FIO_NEW]["store_MBps"], 3)
    return out


def one_request(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """One request's prefix alone: a single job of --request-blocks 2 MiB blocks,
    stored, then loaded, with nothing else queued (what the engine waits for before
    the request's first token). vLLM runs a job as one task, its blocks one after
    another on one thread; kvtiers-fs spreads a job's blocks over its threads."""
    bb, n = 2 * MiB, args.request_blocks
    times: dict[str, list[tuple[float, float]]] = {}
    for run in range(args.runs):
        for name in (["vllm", "kvtiers"] if run % 2 == 0 else ["kvtiers", "vllm"]):
            d = base / f"request{run}"
            try:
                if name == "vllm":
                    got = vllm_pass(args, d, bb, n, args.threads, "huge", per_job=n)
                else:
                    t = kvtiers_pass(d, bb, n, n, args.threads)
                    got = (t["store"], t["load"])
            finally:
                shutil.rmtree(d, ignore_errors=True)
            if got is not None:
                times.setdefault(name, []).append(got)
    out: dict[str, Any] = {"blocks": n, "block_bytes": bb, "runs": args.runs}
    for name, vals in times.items():
        out[name] = {"store_ms": round(statistics.median(v[0] for v in vals) * 1e3, 1),
                     "load_ms": round(statistics.median(v[1] for v in vals) * 1e3, 1),
                     "store_all_ms": [round(v[0] * 1e3, 1) for v in vals],
                     "load_all_ms": [round(v[1] * 1e3, 1) for v in vals]}
    if "vllm" in out and "kvtiers" in out:
        out["load_speedup_vs_vllm"] = round(out["vllm"]["load_ms"] / out["kvtiers"]["load_ms"], 2)
        out["store_speedup_vs_vllm"] = round(
            out["vllm"]["store_ms"] / out["kvtiers"]["store_ms"], 2)
    return out


def load_behind_stores(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Latency of a 2 MiB load submitted behind 1000 queued 2 MiB stores."""
    from kvtiers.contract.jobs import TransferJob
    from kvtiers.contract.keys import make_key

    bb = 2 * MiB
    d = base / "latency"
    tier = _tier(d, bb, 16, capacity=1 << 40, threads=args.threads)
    try:
        resident = [make_key(os.urandom(32)) for _ in range(8)]
        _run_jobs(tier, resident, 8, load=False)

        def one_load(key: bytes, job_id: int) -> float:
            t0 = time.perf_counter()
            tier.submit_load(TransferJob(job_id, [key], [15]))
            while True:
                for r in tier.get_finished_jobs():
                    if r.job_id == job_id:
                        assert r.success
                        return time.perf_counter() - t0
                time.sleep(0.00005)

        idle = statistics.median(one_load(k, 10_000 + i) for i, k in enumerate(resident))
        stores = [make_key(os.urandom(32)) for _ in range(args.queued_stores)]
        t0 = time.perf_counter()
        for i, key in enumerate(stores):
            tier.submit_store(TransferJob(20_000 + i, [key], [i % 8]))
        behind = one_load(resident[0], 99_999)
        tier.drain()
        store_s = time.perf_counter() - t0
        tier.get_finished_jobs()
        block_time = store_s / len(stores) * args.threads * 2  # one block on one thread
    finally:
        tier.close()
        shutil.rmtree(d, ignore_errors=True)
    return {"idle_load_ms": round(idle * 1e3, 2), "behind_1000_stores_ms": round(behind * 1e3, 2),
            "store_block_time_ms": round(block_time * 1e3, 2),
            "extra_in_block_times": round((behind - idle) / block_time, 2),
            "queued_stores": len(stores)}


def startup(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Start-up time with N 4 KiB blocks on disk, by path."""
    import kvtiers_fs.namespace.store as store_mod
    from kvtiers.contract.keys import make_key

    n, bb = args.startup_blocks, 4096
    d = base / "startup"
    out: dict[str, Any] = {"blocks": n}
    tier = _tier(d, bb, 1000, capacity=n * 8192, threads=args.threads, o_direct=False)
    t0 = time.perf_counter()
    from kvtiers.contract.jobs import TransferJob

    done = 0
    next_id = 1
    inflight: set[int] = set()
    while done < n or inflight:
        while done < n and len(inflight) < 8:
            k = min(125, n - done)
            keys = [make_key(os.urandom(32)) for _ in range(k)]
            slot0 = (next_id % 8) * 125
            tier.submit_store(TransferJob(next_id, keys, list(range(slot0, slot0 + k))))
            inflight.add(next_id)
            next_id += 1
            done += k
        for r in tier.get_finished_jobs():
            assert r.success, r.reasons()
            inflight.discard(r.job_id)
        time.sleep(0.0005)
    out["fill_s"] = round(time.perf_counter() - t0, 1)
    # Leave the journal as a crash would (no snapshot at close): replay path.
    saved = store_mod.CLOSE_ROTATE_BYTES
    store_mod.CLOSE_ROTATE_BYTES = 1 << 62
    tier.close()
    store_mod.CLOSE_ROTATE_BYTES = saved

    def open_once() -> float:
        t = time.perf_counter()
        tr = _tier(d, bb, 8, capacity=n * 8192, threads=2, o_direct=False)
        s = time.perf_counter() - t
        assert tr.stats().usage_bytes == n * 8192, tr.stats()
        store_mod.CLOSE_ROTATE_BYTES = 1 << 62
        tr.close()
        store_mod.CLOSE_ROTATE_BYTES = saved
        return s

    ns = next(p for p in d.iterdir() if p.is_dir())
    out["journal_bytes"] = sum(p.stat().st_size for p in ns.glob("journal.*"))
    out["open_snapshot_plus_journal_s"] = [round(open_once(), 2) for _ in range(args.runs)]
    for p in [*ns.glob("snapshot.*"), *ns.glob("journal.*")]:
        p.unlink()
    t = time.perf_counter()
    tr = _tier(d, bb, 8, capacity=n * 8192, threads=2, o_direct=False)
    out["open_rebuild_from_scan_s"] = round(time.perf_counter() - t, 2)
    tr.close()  # the rebuild wrote a snapshot; the journal is empty
    out["open_snapshot_only_s"] = [round(open_once(), 2) for _ in range(args.runs)]
    for k in ("open_snapshot_plus_journal_s", "open_snapshot_only_s"):
        out[k + "_median"] = round(statistics.median(out[k]), 2)
    shutil.rmtree(d, ignore_errors=True)
    return out


def machine() -> dict[str, Any]:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    return {"host": platform.node(), "kernel": platform.release(),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "fio": sh("fio --version")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=None, help="benchmark directory (default: a temp dir "
                   "under /var/tmp); everything under it is removed at the end")
    p.add_argument("--runs", type=int, default=3, help="runs per row; the median is reported")
    p.add_argument("--threads", type=int, default=8, help="threads per kind (both sides)")
    p.add_argument("--bytes-2m", type=int, default=512 * MiB,
                   help="bytes per pass with 2 MiB blocks")
    p.add_argument("--bytes-64k", type=int, default=256 * MiB,
                   help="bytes per pass with 64 KiB blocks")
    p.add_argument("--startup-blocks", type=int, default=1_000_000,
                   help="4 KiB blocks on disk for the start-up test")
    p.add_argument("--queued-stores", type=int, default=1000,
                   help="store jobs queued ahead of the latency test's load")
    p.add_argument("--request-blocks", type=int, default=64,
                   help="blocks of the single job of the one-request test")
    p.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON,
                   help="python of a venv with vLLM 0.33 (its rows are left out when "
                   "this does not exist)")
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "fs_bench.json"),
                   help="where the results go")
    p.add_argument("--quick", action="store_true", help="small sizes, one run")
    p.add_argument("--skip", default="", help="comma list of: throughput,request,latency,startup")
    # vLLM worker mode (internal)
    p.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--vllm-buffer", choices=("4k", "huge"), help=argparse.SUPPRESS)
    p.add_argument("--block-bytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--blocks", type=int, help=argparse.SUPPRESS)
    p.add_argument("--job-blocks", type=int, help=argparse.SUPPRESS)
    p.add_argument("--seed", default="0", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.vllm_worker:
        vllm_worker(args)
        return
    if args.quick:
        args.runs, args.bytes_2m, args.bytes_64k = 1, 64 * MiB, 16 * MiB
        args.startup_blocks, args.queued_stores, args.request_blocks = 20_000, 100, 16
    args.job_blocks_for = {2 * MiB: 8, 64 << 10: 64}
    skip = set(filter(None, args.skip.split(",")))
    base = Path(args.dir or tempfile.mkdtemp(prefix="kvfs-bench-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(), "dir": str(base), "runs": args.runs, "threads": args.threads,
        "job_blocks": {"2 MiB": 8, "64 KiB": 64},
        "units": "MB/s = 1e6 bytes of block data per second; median of runs",
    }
    try:
        if "throughput" not in skip:
            result["throughput"] = throughput(args, base)
            result["targets"] = targets(result["throughput"])
        if "request" not in skip:
            result["one_request"] = one_request(args, base)
        if "latency" not in skip:
            result["load_behind_stores"] = load_behind_stores(args, base)
        if "startup" not in skip:
            result["startup"] = startup(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\nkvtiers-fs bench ({result['machine']['host']}, {args.runs} runs, "
          f"{args.threads} threads per kind)")
    print(f"{'block':>8}  {'what':<44} {'store MB/s':>11} {'load MB/s':>10}")
    for r in result.get("throughput", []):
        print(f"{r['block']:>8}  {r['what']:<44} {r['store_MBps'] or '-':>11} "
              f"{r['load_MBps'] or '-':>10}")
    if result.get("targets"):
        print("targets (2 MiB):", result["targets"])
    if "one_request" in result:
        print("one request alone:", result["one_request"])
    if "load_behind_stores" in result:
        print("load behind queued stores:", result["load_behind_stores"])
    if "startup" in result:
        print("start-up:", result["startup"])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.json)


if __name__ == "__main__":
    main()
