"""kvtiers' SGLang L3 backend over the fs tier against SGLang's own `file` backend:
batch set and get throughput on one directory, Llama-3-8B-shaped pages.

Each backend is driven the way SGLang 0.5.23's HiCache controller drives it:

- **kvtiers (v1)**: `batch_set_v1` / `batch_get_v1` with host indices: the fs tier
  reads and writes the host pool's pages in place (`"interface_v1": 1`);
- **kvtiers (generic)**: `batch_set` / `batch_get` with SGLang's flat page tensors
  (`get_data_page` before a set, `set_from_flat_data_page` after a get, as the
  controller's generic path does);
- **sglang file**: SGLang's `HiCacheFile` through that same generic path (it has no
  zero-copy path).

Batches of 128 pages (SGLang's `STORAGE_BATCH_SIZE`), from a host pool in SGLang's
`page_first` layout allocated by SGLang's own host allocator. Every run writes fresh
pages (random bytes, random page keys) and reads them back into other host pages;
every page read is compared with what was written (outside the timing), and the
kvtiers fs tier verifies its checksum on every load as always. Backends run
interleaved, their order rotating per run; the table shows the median of the runs.
The fs tier runs with buffered I/O (`o_direct: false`), as the file backend does, so
both read back from the page cache; `--o-direct auto` measures the fs tier's default.

    python bench/sglang_bench.py [--dir /path/on/the/disk] [--runs 5] [--pages 256]

Writes bench/results/sglang_bench.json. Needs SGLang (requirements-sglang.txt).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvtiers_sglang import BACKEND_CLASS, BACKEND_MODULE  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    STORAGE_BATCH_SIZE,
    HiCacheStorage,
    HiCacheStorageConfig,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from tests.sglang.host_pool import HostPool  # noqa: E402

# Llama-3-8B: 32 layers, 8 KV heads of 128, bfloat16 (TP 1)
LAYERS, HEADS, HEAD_DIM = 32, 8, 128
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BACKENDS = ("kvtiers (v1)", "kvtiers (generic)", "sglang file")


def storage_config(extra: dict[str, Any]) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=MODEL, extra_config=extra,
    )


def make(name: str, root: Path, pool: HostPool, o_direct: Any) -> HiCacheStorage:
    if name == "sglang file":
        root.mkdir(parents=True)
        return StorageBackendFactory.create_backend(
            "file", storage_config({"file_storage_path": str(root)}), pool)
    root.mkdir(parents=True)
    extra = {
        "backend_name": "kvtiers", "module_path": BACKEND_MODULE, "class_name": BACKEND_CLASS,
        "interface_v1": 1 if name == "kvtiers (v1)" else 0,
        "secondary_tiers": [{"type": "fs", "root_dir": str(root), "capacity_bytes": 16 << 30,
                             "o_direct": o_direct}],
    }  # fmt: skip
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
    backend.register_mem_pool_host(pool)
    return backend


def batches(n: int) -> list[range]:
    return [range(i, min(i + STORAGE_BATCH_SIZE, n)) for i in range(0, n, STORAGE_BATCH_SIZE)]


def set_pages(name: str, backend: HiCacheStorage, pool: HostPool, keys: list[str],
              pages: list[int]) -> bool:
    ok = True
    for b in batches(len(keys)):
        ks = [keys[i] for i in b]
        if name == "kvtiers (v1)":
            ok &= all(backend.batch_set_v1(ks, pool.indices([pages[i] for i in b])))
        else:  # SGLang's generic page set
            values = [pool.get_data_page(pages[i] * pool.page_size) for i in b]
            ok &= bool(backend.batch_set(ks, values))
    return ok


def get_pages(name: str, backend: HiCacheStorage, pool: HostPool, keys: list[str],
              pages: list[int]) -> int:
    loaded = 0
    for b in batches(len(keys)):
        ks = [keys[i] for i in b]
        if name == "kvtiers (v1)":
            loaded += sum(backend.batch_get_v1(ks, pool.indices([pages[i] for i in b])))
            continue
        dummies = [pool.get_dummy_flat_data_page() for _ in b]  # SGLang's generic page get
        got = backend.batch_get(ks, dummies)
        for i, data in zip(b, got, strict=True):
            if data is None:
                break
            pool.set_from_flat_data_page(pages[i] * pool.page_size, data)
            loaded += 1
    return loaded


def digests(pool: HostPool, pages: list[int]) -> list[bytes]:
    return [hashlib.blake2b(pool.page_bytes(p), digest_size=16).digest() for p in pages]


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def one_run(name: str, base: Path, pool: HostPool, n: int, run: int, o_direct: Any
            ) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1000 * run + BACKENDS.index(name))
    keys = [bytes(torch.randint(0, 256, (32,), generator=gen, dtype=torch.uint8).tolist()).hex()
            for _ in range(n)]
    src, dst = list(range(n)), list(range(n, 2 * n))
    pool.fill_random(gen)
    want = digests(pool, src)
    root = base / f"{name.split()[0]}-{name.split()[-1].strip('()')}-{run}"
    backend = make(name, root, pool, o_direct)
    try:
        stored, set_s = timed(lambda: set_pages(name, backend, pool, keys, src))
        loaded, get_s = timed(lambda: get_pages(name, backend, pool, keys, dst))
    finally:
        backend.close() if hasattr(backend, "close") else None
    wrong = sum(a != b for a, b in zip(digests(pool, dst)[:loaded], want[:loaded], strict=True))
    shutil.rmtree(root, ignore_errors=True)
    page_bytes = 2 * LAYERS * pool.page_size * HEADS * HEAD_DIM * 2
    return {"backend": name, "run": run, "stored_all": bool(stored), "loaded": loaded,
            "wrong_pages": wrong, "set_s": set_s, "get_s": get_s,
            "set_gbps": n * page_bytes / set_s / 1e9, "get_gbps": n * page_bytes / get_s / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None,
                        help="where both backends write (default: a temporary directory)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pages", type=int, default=256, help="pages per run")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per page")
    parser.add_argument("--o-direct", default="false", choices=["false", "auto"])
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/sglang_bench.json")
    args = parser.parse_args()
    o_direct: Any = False if args.o_direct == "false" else "auto"
    base = Path(tempfile.mkdtemp(prefix="sglang-bench-", dir=args.dir))
    pool = HostPool(layout="page_first", pages=2 * args.pages, page_size=args.page_size,
                    layers=LAYERS, heads=HEADS, head_dim=HEAD_DIM)
    page_bytes = 2 * LAYERS * args.page_size * HEADS * HEAD_DIM * 2
    rows = []
    try:
        for run in range(args.runs):
            order = BACKENDS[run % 3:] + BACKENDS[: run % 3]
            for name in order:
                row = one_run(name, base, pool, args.pages, run, o_direct)
                rows.append(row)
                print(f"run {run} {name:18s} set {row['set_gbps']:6.2f} GB/s  "
                      f"get {row['get_gbps']:6.2f} GB/s  loaded {row['loaded']}/{args.pages}"
                      f"  wrong {row['wrong_pages']}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = {}
    print(f"\n{args.pages} pages of {page_bytes / 2**20:.0f} MiB (Llama-3-8B, {args.page_size} "
          f"tokens/page), batches of {STORAGE_BATCH_SIZE}, median of {args.runs} runs")
    print(f"{'backend':20s} {'set GB/s':>9s} {'get GB/s':>9s} {'wrong pages':>12s}")
    for name in BACKENDS:
        mine = [r for r in rows if r["backend"] == name]
        summary[name] = {
            "set_gbps": statistics.median(r["set_gbps"] for r in mine),
            "get_gbps": statistics.median(r["get_gbps"] for r in mine),
            "wrong_pages": sum(r["wrong_pages"] for r in mine),
            "pages_not_loaded": sum(args.pages - r["loaded"] for r in mine),
        }
        s = summary[name]
        print(f"{name:20s} {s['set_gbps']:9.2f} {s['get_gbps']:9.2f} {s['wrong_pages']:12d}")
    out = {
        "what": "batch set/get throughput: kvtiers' SGLang backend over fs vs SGLang's file "
                "backend, one directory, interleaved runs, medians",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python bench/sglang_bench.py " + " ".join(sys.argv[1:]),
        "params": {"pages": args.pages, "page_size_tokens": args.page_size,
                   "page_bytes": page_bytes, "runs": args.runs, "fs_o_direct": o_direct,
                   "layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD_DIM,
                   "dtype": "bfloat16", "layout": "page_first",
                   "batch_pages": STORAGE_BATCH_SIZE},
        "summary": summary,
        "runs": rows,
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
