#!/usr/bin/env python3
"""Crash torture of the fs tier, longer than CI's: writer processes store random
blocks and are killed with SIGKILL at random instants, then the tier is opened again
on the same root and checked - the checks of tests/fs/test_crash.py, many more times.

    .venv/bin/python bench/fs_crash_torture.py                      # 500 cycles a mode
    .venv/bin/python bench/fs_crash_torture.py --cycles 2000 --dir /var/tmp/torture

Three modes, each on its own root: `keep` (capacity never reached: every block the
writer was told was stored must be found after every restart, with its bytes);
`shared` (two writers storing keys of one small key space at the same time, each
killed at its own instant: a store of a key the other writer has in flight waits
for that write and is reported only once a copy is committed - every block either
writer was told was stored must be found); and `evict` (a 48-block tier, so nearly
every store evicts and recycles a file: usage stays exact and within capacity, and
no torn or wrong block is ever served). After every restart: no intent of a dead
writer left, no temporary file left, usage equal to the bytes of the complete block
files, every block in the index loads with its bytes. `shared` ends with a run whose
writers are not killed, to count how many stores waited for the other writer (so
the mode is known to exercise that). Exit 1 at the first failure, naming the cycle.
Run from the repository root (it uses the tests' writer and checks).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kvtiers_fs.namespace.store as store_mod
from rich.progress import Progress

from tests.fs.child import read_log, writer
from tests.fs.test_crash import BLOCK, _check_restart, _kill_cycle, _kill_two_cycle

MODES = {"keep": 1 << 20, "shared": 1 << 20, "evict": 48}  # capacity in blocks


def torture(mode: str, cycles: int, base: Path, seed: int, progress: Progress) -> dict[str, Any]:
    mp = multiprocessing.get_context("forkserver")
    mp.set_forkserver_preload(["tests.fs.child"])
    root = base / mode
    root.mkdir(parents=True)
    capacity = MODES[mode]
    rng = random.Random(seed)
    reported: set[bytes] = set()
    verified: set[bytes] = set()
    children: list[Any] = []
    task = progress.add_task(f"{mode}: kill -9 cycles", total=cycles)
    start = time.perf_counter()
    try:
        for cycle in range(cycles):
            log = base / f"{mode}.log{cycle}"
            if mode == "shared":
                logs = (log, base / f"{mode}.log{cycle}b")
                _kill_two_cycle(mp, children, root, capacity, seed * 100_000 + cycle, logs,
                                rng, key_base=cycle * 1000)
                for one in logs:
                    reported |= set(read_log(str(one)))
            else:
                _kill_cycle(mp, children, root, capacity, seed * 100_000 + cycle, log, rng)
                if mode == "keep":
                    reported |= set(read_log(str(log)))
            try:
                _check_restart(root, capacity, reported, verified)
            except AssertionError as exc:
                raise SystemExit(f"{mode}: cycle {cycle} failed: {exc}") from None
            children.clear()
            progress.advance(task)
    finally:
        for p in children:
            if p.is_alive():
                p.kill()
            p.join(10)
    row: dict[str, Any] = {
        "mode": mode, "capacity_blocks": capacity, "cycles": cycles,
        # evict: blocks reported stored may be evicted since, so they are not tracked
        "blocks_reported_stored": len(reported) if mode != "evict" else None,
        "blocks_verified": len(verified),
        "seconds": round(time.perf_counter() - start, 1)}
    if mode == "shared":
        row["stores_that_waited_for_the_other_writer"] = _count_waits(mp, base)
    return row


def _count_waits(mp: Any, base: Path) -> int:
    """Two writers as in a `shared` cycle, not killed: how many of their stores
    waited for the other's write of the same key."""
    root = base / "shared-waits"
    root.mkdir()
    queue = mp.Queue()
    procs = []
    for i in range(2):
        ready = mp.Event()
        p = mp.Process(target=writer, args=(str(root), 1 << 20, 7 + i, str(base / f"w{i}"),
                                            ready),
                       kwargs={"rotate_bytes": 8192, "block_bytes": BLOCK, "key_space": 96,
                               "in_flight": 3, "jobs": 60, "result_queue": queue})
        p.start()
        procs.append((p, ready))  # (the event must outlive the child's start)
    reports = [queue.get(timeout=300) for _ in procs]
    for p, _ in procs:
        p.join(30)
    return sum(int(r["waited"]) for r in reports)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=500, help="kill cycles per mode")
    p.add_argument("--modes", default="keep,shared,evict",
                   help="comma list of: keep, shared, evict")
    p.add_argument("--dir", default=None, help="where the roots go (default: a temp dir "
                   "under /var/tmp, removed at the end)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=str(Path(__file__).parent / "results" /
                                         "fs_crash_torture.json"))
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        p.error(f"unknown mode(s) {sorted(unknown)}; allowed: {', '.join(MODES)}")
    store_mod.ROTATE_MIN_BYTES = 8192  # journal rotations happen during the run too
    machine = f"{platform.node()}: {platform.machine()}, {multiprocessing.cpu_count()} cores, " \
              f"Python {platform.python_version()}"
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvfs-torture-", dir=args.dir or "/var/tmp") as d, \
            Progress(disable=not sys.stderr.isatty()) as progress:
        for m in modes:
            rows.append(torture(m, args.cycles, Path(d), args.seed, progress))
            # Written after every mode: a long run stopped later keeps what it finished.
            out.write_text(json.dumps({"command": " ".join(sys.argv), "machine": machine,
                                       "runs": rows}, indent=1) + "\n")
    print(f"{'mode':>6} {'cycles':>7} {'seconds':>8} {'reported stored':>16} "
          f"{'verified':>9} {'waited':>7}")
    for r in rows:
        reported = r["blocks_reported_stored"]
        waited = r.get("stores_that_waited_for_the_other_writer", "")
        print(f"{r['mode']:>6} {r['cycles']:>7} {r['seconds']:>8} "
              f"{'-' if reported is None else str(reported) + ' (all found)':>16} "
              f"{r['blocks_verified']:>9} {waited:>7}")
    print("all checks passed after every restart")
    print("wrote", args.json)

if __name__ == "__main__":
    main()
