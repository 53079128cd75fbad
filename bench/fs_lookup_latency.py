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
max per lookup, the max of how late the scheduler woke from its 1 ms pause
("wake late": the time to take the GIL back - a long C call or a garbage collection
in another thread shows here, not in the lookups, as the scheduler rarely loses the
GIL in the middle of a step), the background work's duration, the interpreter's full garbage
collections meanwhile (each walks the whole index holding the GIL), and - for a
store that paces its work - how long the work ran between two releases of the GIL
(CPU time, p99 and max): what the work itself can add to one scheduler call,
apart from the machine's noise (the `idle` row's max). JSON goes to
bench/results/fs_lookup_latency.json. Run from the repository root; it runs the
fs store of whichever kvtiers-fs is on the path (the same harness measured the
store before issue 11 - see the `--note` of the committed results).
"""

from __future__ import annotations

import argparse
import gc
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

import kvtiers_fs.namespace.store as store_mod
from kvtiers.contract.keys import make_key
from kvtiers.policies.lru import LRUPolicy
from kvtiers.sdk import ErrorCounts
from kvtiers_fs.disk import layout
from kvtiers_fs.journal import records as jr
from kvtiers_fs.namespace.store import RootStore

from tests.fs.helpers import context, open_tier

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
                      errors=ErrorCounts(_log, "kvtiers-fs tail"), logger=_log)
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


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000


class GcPauses:
    """Durations of the interpreter's collections: the full (generation 2) ones -
    with a million-entry index in memory each walks it, holding the GIL, whichever
    thread triggered it; an engine avoids that with `gc.freeze()` after start-up -
    and the longest young (generation 0/1) one, which walks only the young objects
    (long only if a large container is still young: issue 11's catch-up stall)."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.young: list[float] = []
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            took = time.perf_counter() - self._t
            (self.pauses if info.get("generation") == 2 else self.young).append(took)

    def take(self) -> dict[str, Any]:
        out, self.pauses = self.pauses, []
        young, self.young = self.young, []
        return {"gc_full_collections": len(out),
                "gc_max_ms": round(max(out) * 1e3, 1) if out else None,
                "gc_young_max_ms": round(max(young) * 1e3, 1) if young else None}


class Stretches:
    """How much CPU the store's background work uses between two releases of the GIL
    (`kvtiers_fs.pacing.pause`; thread CPU time, so neither preemption by other
    processes nor waiting for the GIL counts - though on a virtual machine the
    host's preemption of the vCPU does, so only p50/p99 are clean there): what
    the work can add to one scheduler call, apart from the machine's noise. Only
    for a store that paces its work."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last: dict[int, float] = {}
        try:
            from kvtiers_fs import pacing
        except ImportError:
            self.active = False
            return
        self.active = True
        real = pacing.pause

        def pause() -> None:
            me, now = threading.get_ident(), time.thread_time()
            if me in self._last:
                self.times.append(now - self._last[me])
            real()
            self._last[me] = time.thread_time()

        for name in ("pacing", "journal.index", "namespace.store", "journal.records",
                     "journal.files"):
            module = sys.modules.get(f"kvtiers_fs.{name}")
            if module is not None and hasattr(module, "pause"):
                module.pause = pause  # type: ignore[attr-defined]

    def take(self) -> dict[str, Any]:
        out, self.times = sorted(self.times), []
        self._last.clear()
        if not self.active or not out:
            return {"hold_p50_us": None, "hold_p99_us": None, "hold_max_us": None}
        return {"hold_p50_us": round(out[len(out) // 2] * 1e6, 1),
                "hold_p99_us": round(out[int(0.99 * len(out))] * 1e6, 1),
                "hold_max_us": round(out[-1] * 1e6, 1)}


def measure(tier: Any, keys: list[bytes], background: threading.Thread | None,
            step: int, min_s: float) -> dict[str, Any]:
    """Scheduler steps of `step` timed lookups until `background` ends (and at
    least `min_s` seconds)."""
    lat: list[int] = []
    late: list[int] = []
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
        t0 = pc()
        time.sleep(0.001)  # the engine waits for the GPU (GIL released)
        late.append(pc() - t0 - 1_000_000)  # the GIL taken back (and the OS's timer)
        busy = background is not None and background.is_alive()
        if not busy and time.perf_counter() - start >= min_s:
            break
    lat.sort()
    late.sort()
    return {"lookups": len(lat), "p50_us": round(percentile(lat, 0.5), 2),
            "p99_9_us": round(percentile(lat, 0.999), 1), "max_us": round(lat[-1] / 1000, 1),
            "wake_late_p99_us": round(percentile(late, 0.99), 1),
            "wake_late_max_us": round(late[-1] / 1000, 1),
            "seconds": round(time.perf_counter() - start, 2),
            "work_seconds": round(work[1] - work[0], 2) if background is not None else None}


def rotate(store: Any) -> threading.Thread:
    """A thread that writes the next snapshot as the store's own rotation does."""
    def run() -> None:
        if hasattr(store, "_rotate"):  # this version: in pieces, without the lock
            store_mod.ROTATE_FACTOR = 0  # type: ignore[attr-defined]  # now, whatever the size
            assert store._rotate(0), "no rotation happened"
        else:  # the store before issue 11 (its _maybe_rotate, without the threshold)
            with store._locked():
                new = store.gen + 1
                store._write_generation(new)  # the policy's export, under the index lock
                store._append([jr.Record(jr.ROTATE, store.writer, new, b"")])
                store._follow_rotation(new)
                store._remove_old_generations(new)
    return threading.Thread(target=run, name="rotate")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=1_000_000)
    p.add_argument("--tail", type=int, default=300_000, help="journal records to catch up")
    p.add_argument("--step", type=int, default=256, help="lookups per scheduler step")
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--note", default="")
    p.add_argument("--gc-freeze", action="store_true",
                   help="gc.freeze() once the index is loaded (as an engine does)")
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
        pauses = GcPauses()
        tier = open_tier(ctx, root, capacity_blocks=4 * args.blocks)
        opened = time.perf_counter() - t
        rss_mb = rss_bytes() / 1e6
        load_gc = pauses.take()
        # What the next generation-1 collection costs, whichever thread triggers it:
        # the young objects' walk (a million-entry container left young walks whole).
        t = time.perf_counter()
        gc.collect(1)
        first_young_ms = (time.perf_counter() - t) * 1e3
        pauses.take()
        if args.gc_freeze:
            gc.collect()
            gc.freeze()
        stretches = Stretches()
        try:
            store = tier.stores[0]
            assert store.stats()[1] == args.blocks
            rows.append({"phase": "idle", **measure(tier, keys, None, args.step, 3.0),
                         **pauses.take(), **stretches.take()})
            rows.append({"phase": "rotation",
                         **measure(tier, keys, rotate(store), args.step, 0.5), **pauses.take(),
                         **stretches.take()})
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
            pauses.take()
            stretches.take()
            rows.append({"phase": "catch-up", **measure(tier, keys, sync, args.step, 0.5),
                         "tail_bytes": tail_bytes, **pauses.take(), **stretches.take()})
            assert store.stats()[1] >= args.blocks + args.tail // 2 - 1000
        finally:
            tier.close()
    print(f"{args.blocks} blocks (index loaded in {opened:.1f} s, process RSS {rss_mb:.0f} MB "
          f"with the bench's key list; longest young GC while loading "
          f"{load_gc['gc_young_max_ms'] or '-'} ms, the first generation-1 GC after it "
          f"{first_young_ms:.1f} ms), {args.step} lookups per step; latency of one lookup "
          f"on the scheduler thread:")
    print(f"{'phase':>9} {'lookups':>9} {'p50 µs':>8} {'p99.9 µs':>9} {'max µs':>9} "
          f"{'wake late max µs':>17} "
          f"{'work s':>7} {'full GCs':>9} {'GC max ms':>10} {'young GC max ms':>16} "
          f"{'GIL hold p50/p99/max µs':>24}")
    for r in rows:
        hold = "/".join(str(r[k] or "-") for k in ("hold_p50_us", "hold_p99_us", "hold_max_us"))
        print(f"{r['phase']:>9} {r['lookups']:>9} {r['p50_us']:>8} {r['p99_9_us']:>9} "
              f"{r['max_us']:>9} {r['wake_late_max_us']:>17} "
              f"{r['work_seconds'] or '-':>7} {r['gc_full_collections']:>9} "
              f"{r['gc_max_ms'] or '-':>10} {r['gc_young_max_ms'] or '-':>16} "
              f"{hold:>24}")
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        rev = ""
    doc = {"command": " ".join(sys.argv), "note": args.note, "git": rev,
           "machine": f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores, "
                      f"Python {platform.python_version()}",
           "blocks": args.blocks, "tail_records": args.tail, "step": args.step,
           "load_seconds": round(opened, 2), "rss_mb_after_load": round(rss_mb),
           "gc_freeze": args.gc_freeze, "load_gc": load_gc,
           "first_young_gc_after_load_ms": round(first_young_ms, 1),
           "store": store_mod.__file__, "phases": rows}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    runs.append(doc)
    out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
