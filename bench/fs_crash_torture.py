#!/usr/bin/env python3
"""Crash torture of the fs tier, longer than CI's: a writer process stores random
blocks and is killed with SIGKILL at a random instant, then the tier is opened again
on the same root and checked - the checks of tests/fs/test_crash.py, many more times.

    .venv/bin/python bench/fs_crash_torture.py                      # 500 + 500 cycles
    .venv/bin/python bench/fs_crash_torture.py --cycles 2000 --dir /var/tmp/torture

Two modes, each on its own root: `keep` (capacity never reached: every block the
writer was told was stored must be found after every restart, with its bytes) and
`evict` (a 48-block tier, so nearly every store evicts and recycles a file: usage
stays exact and within capacity, and no torn or wrong block is ever served). After
every restart: no intent of the dead writer left, no temporary file left, usage
equal to the bytes of the complete block files, every block in the index loads with
its bytes. Exit 1 at the first failure, naming the cycle. Run from the repository
root (it uses the tests' writer and checks).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.progress import Progress  # noqa: E402

import kvtiers_fs.store as store_mod  # noqa: E402
from tests.fs.child import read_log  # noqa: E402
from tests.fs.test_crash import _check_restart, _kill_cycle  # noqa: E402

MODES = {"keep": 1 << 20, "evict": 48}  # capacity in blocks


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
    return {"mode": mode, "capacity_blocks": capacity, "cycles": cycles,
            # evict: blocks reported stored may be evicted since, so they are not tracked
            "blocks_reported_stored": len(reported) if mode == "keep" else None,
            "blocks_verified": len(verified),
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=500, help="kill cycles per mode")
    p.add_argument("--modes", default="keep,evict", help="comma list of: keep, evict")
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
    with tempfile.TemporaryDirectory(prefix="kvfs-torture-", dir=args.dir or "/var/tmp") as d:
        with Progress(disable=not sys.stderr.isatty()) as progress:
            rows = [torture(m, args.cycles, Path(d), args.seed, progress) for m in modes]
    for r in rows:
        reported = (f"{r['blocks_reported_stored']} blocks reported stored (all found), "
                    if r["mode"] == "keep" else "")
        print(f"{r['mode']:>5}: {r['cycles']} kill -9 cycles in {r['seconds']} s, {reported}"
              f"{r['blocks_verified']} blocks verified after restarts: all checks passed")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "runs": rows},
                                          indent=1) + "\n")
    print("wrote", args.json)


if __name__ == "__main__":
    main()
