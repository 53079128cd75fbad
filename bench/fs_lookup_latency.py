#!/usr/bin/env python3
"""The scheduler thread's lookup latency on an fs tier holding many blocks, while
the tier rotates its snapshot and while it catches up a long journal tail that
another writer process appended (issue 11, item 5; DESIGN.md invariant 3).

    .venv/bin/python bench/fs_lookup_latency.py                    # 1M blocks
    .venv/bin/python bench/fs_lookup_latency.py --blocks 200000 --dir /var/tmp

The namespace is built directly as a snapshot of `--blocks` committed blocks (the
index only: no block files are needed, lookups never read them). The main thread
plays the scheduler: steps of `--step` lookups of random held keys, each timed,
then a 1 ms pause (the engine waiting for the GPU, which releases the GIL). Phases:

- `idle`: nothing else runs (the machine's own noise);
- `rotation`: a background thread writes the next snapshot (the work that grows
  with the block count) and renames it into place;
- `catch-up`: another process has appended `--tail` journal records (intents and
  commits of new blocks); a background thread reads and applies them (what the
  probe thread does after a lookup of a key it has not seen).

Each phase lasts as long as its background work; the table gives p50, p99.9 and
max per lookup, and the background work's duration. JSON goes to
bench/results/fs_lookup_latency.json. Run from the repository root; it runs the
fs store of whichever kvtiers-fs is on the path (the same harness measured the
store before issue 11 - see the `--note` of the committed results).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kvtiers_fs.store as store_mod  # noqa: E402
from kvtiers.keys import make_key  # noqa: E402
from kvtiers.policies.lru import LRUPolicy  # noqa: E402
from kvtiers_fs import journal as jr  # noqa: E402
from kvtiers_fs import layout  # noqa: E402
from kvtiers_fs.errorlog import ErrorLog  # noqa: E402
from kvtiers_fs.store import RootStore  # noqa: E402

from tests.fs.helpers import context, open_tier  # noqa: E402

BLOCK = 4096
FILE = layout.file_bytes(BLOCK)
_log = logging.getLogger("bench")


def build_namespace(root: Path, keys: list[bytes]) -> None:
    """snapshot.1 of `keys` committed (oldest first) and an empty journal.1."""
    ns = root / context(BLOCK).namespace.fingerprint
    ns.mkdir(mode=0o700)
    records = [jr.Record(jr.ENTRY, 0, FILE, k) for k in keys]
    data = jr.pack_snapshot(1, records, len(keys), len(keys) * FILE)
    (ns / "snapshot.1").write_bytes(data)
    (ns / "journal.1").write_bytes(b"")


def append_tail(root: str, n_records: int, seed: int, ready: Any, go: Any) -> None:
    """Another writer process: open the namespace, then append intents and commits
    of new blocks (no files: only the journal matters here) until `n_records`."""
    ctx = context(BLOCK)
    store = RootStore(root, ctx.namespace, capacity_bytes=1 << 50, policy_factory=LRUPolicy,
                      errors=ErrorLog(_log, "tail"), logger=_log)
    store.open()
    ready.set()
    go.wait()
    rng = random.Random(seed)
    written = 0
    while written < n_records:
        idns = [layout.ident(make_key(rng.randbytes(32))) for _ in range(1000)]
        store.reserve([(i, FILE) for i in idns])
        store.commit(idns, [])
        written += 2000
    store.close()


def percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000


def measure(tier: Any, keys: list[bytes], background: threading.Thread | None,
            step: int, min_s: float) -> dict[str, Any]:
    """Scheduler steps of `step` timed lookups until `background` ends (and at
    least `min_s` seconds)."""
    lat: list[int] = []
    rng = random.Random(1)
    work = [0.0, 0.0]
    if background is not None:
        inner = background.run

        def timed() -> None:
            work[0] = time.perf_counter()
            inner()
            work[1] = time.perf_counter()

        background.run = timed  # type: ignore[method-assign]
    pc = time.perf_counter_ns
    lookup = tier.lookup
    start = time.perf_counter()
    if background is not None:
        background.start()
    while True:
        for key in rng.choices(keys, k=step):
            t0 = pc()
            lookup(key)
            lat.append(pc() - t0)
        time.sleep(0.001)  # the engine waits for the GPU (GIL released)
        busy = background is not None and background.is_alive()
        if not busy and time.perf_counter() - start >= min_s:
            break
    lat.sort()
    return {"lookups": len(lat), "p50_us": round(percentile(lat, 0.5), 2),
            "p99_9_us": round(percentile(lat, 0.999), 1), "max_us": round(lat[-1] / 1000, 1),
            "seconds": round(time.perf_counter() - start, 2),
            "work_seconds": round(work[1] - work[0], 2) if background is not None else None}


def rotate(store: Any) -> threading.Thread:
    """A thread that writes the next snapshot as the store's own rotation does."""
    def run() -> None:
        if hasattr(store, "_rotate"):  # this version: in pieces, without the lock
            store_mod.ROTATE_FACTOR = 0  # type: ignore[attr-defined]  # now, whatever the size
            assert store._rotate(0), "no rotation happened"
        else:  # the store before issue 11: export under the index lock
            with store._locked():
                store._write_generation(store.gen + 1)
    return threading.Thread(target=run, name="rotate")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=1_000_000)
    p.add_argument("--tail", type=int, default=300_000, help="journal records to catch up")
    p.add_argument("--step", type=int, default=256, help="lookups per scheduler step")
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--note", default="")
    p.add_argument("--json", default=str(Path(__file__).parent / "results" /
                                         "fs_lookup_latency.json"))
    args = p.parse_args()
    rng = random.Random(7)
    keys = [make_key(rng.randbytes(32)) for _ in range(args.blocks)]
    mp = multiprocessing.get_context("spawn")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvfs-latency-", dir=args.dir) as d:
        root = Path(d)
        t = time.perf_counter()
        build_namespace(root, keys)
        ctx = context(BLOCK, slots=8)
        tier = open_tier(ctx, root, capacity_blocks=4 * args.blocks)
        opened = time.perf_counter() - t
        try:
            store = tier.stores[0]
            assert store.stats()[1] == args.blocks
            rows.append({"phase": "idle", **measure(tier, keys, None, args.step, 3.0)})
            rows.append({"phase": "rotation",
                         **measure(tier, keys, rotate(store), args.step, 0.5)})
            ready, go = mp.Event(), mp.Event()
            child = mp.Process(target=append_tail, args=(str(root), args.tail, 3, ready, go))
            child.start()
            assert ready.wait(600)
            go.set()
            child.join()
            assert child.exitcode == 0
            tail_bytes = os.path.getsize(root / ctx.namespace.fingerprint /
                                         jr.journal_name(store._journal.gen
                                                         if hasattr(store, "_journal")
                                                         else store.gen))
            sync = threading.Thread(target=store.sync, name="catch-up")
            rows.append({"phase": "catch-up", **measure(tier, keys, sync, args.step, 0.5),
                         "tail_bytes": tail_bytes})
            assert store.stats()[1] >= args.blocks + args.tail // 2 - 1000
        finally:
            tier.close()
    print(f"{args.blocks} blocks (index loaded in {opened:.1f} s), {args.step} lookups "
          f"per step; latency of one lookup on the scheduler thread:")
    print(f"{'phase':>9} {'lookups':>9} {'p50 µs':>8} {'p99.9 µs':>9} {'max µs':>9} "
          f"{'work s':>7}")
    for r in rows:
        print(f"{r['phase']:>9} {r['lookups']:>9} {r['p50_us']:>8} {r['p99_9_us']:>9} "
              f"{r['max_us']:>9} {r['work_seconds'] or '-':>7}")
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        rev = ""
    doc = {"command": " ".join(sys.argv), "note": args.note, "git": rev,
           "machine": f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores, "
                      f"Python {platform.python_version()}",
           "blocks": args.blocks, "tail_records": args.tail, "step": args.step,
           "store": store_mod.__file__, "phases": rows}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    runs.append(doc)
    out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
