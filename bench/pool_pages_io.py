#!/usr/bin/env python3
"""Why the CPU pool asks for transparent huge pages: O_DIRECT file I/O of 2 MiB
blocks from/to a buffer of 4 KiB pages vs one of 2 MiB pages, same files, same run.

    python bench/pool_pages_io.py --dir /var/tmp/pages-bench [--runs 8] [--threads 16]

A 2 MiB transfer from 4 KiB pages is 512 physical segments, split by the block layer
into several requests (max_segments is often 128-254); from one huge page it is one
segment. Prints MB/s (median of runs, order rotated) for cold reads, overwrites
of existing files and writes of new files (the last two: why a full fs tier
recycles evicted files); writes JSON next to the other results.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MiB = 1 << 20
BLOCK = 2 * MiB
HEADER = 4096  # the fs tier's header page, read/written in the same call


def buffer(nbytes: int, huge: bool) -> mmap.mmap:
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    buf.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    for off in range(0, nbytes, 64 * MiB):
        buf[off : off + 64 * MiB] = os.urandom(min(64 * MiB, nbytes - off))
    return buf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="a directory on the filesystem to test "
                   "(created; removed at the end)")
    p.add_argument("--blocks", type=int, default=512)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--json", default=str(Path(__file__).parent / "results" /
                                         "pool_pages_io.json"))
    args = p.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    n = args.blocks
    try:
        pools = {"4 KiB pages": buffer(BLOCK * n, False), "huge pages": buffer(BLOCK * n, True)}
        headers = mmap.mmap(-1, HEADER * n)
        paths = [str(d / f"b{i:06d}") for i in range(n)]

        def io(name: str, write: bool, new: bool = False) -> Callable[[int], None]:
            view = memoryview(pools[name])
            where = [p + ".new" for p in paths] if new else paths

            def one(i: int) -> None:
                vecs = [memoryview(headers)[i * HEADER : (i + 1) * HEADER],
                        view[i * BLOCK : (i + 1) * BLOCK]]
                fd = os.open(where[i], (os.O_WRONLY | os.O_CREAT if write else os.O_RDONLY)
                             | os.O_DIRECT, 0o600)
                try:
                    (os.pwritev if write else os.preadv)(fd, vecs, 0)
                finally:
                    os.close(fd)
            return one

        with ThreadPoolExecutor(args.threads) as ex:
            list(ex.map(io("4 KiB pages", True), range(n)))  # the files exist from here on
            os.sync()
            cases = {f"{what} {name}": io(name, what != "read", what == "new files")
                     for what in ("read", "overwrite", "new files") for name in pools}
            got: dict[str, list[float]] = {k: [] for k in cases}
            names = list(cases)
            for run in range(args.runs):
                k = run % len(names)
                for name in names[k:] + names[:k]:
                    t = time.perf_counter()
                    list(ex.map(cases[name], range(n)))
                    got[name].append(n * BLOCK / (time.perf_counter() - t) / 1e6)
                    for path in paths:  # "new files" writes new files every time
                        Path(path + ".new").unlink(missing_ok=True)
                    os.sync()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    thp = [ln.strip() for ln in meminfo if ln.startswith("AnonHugePages")]
    result = {"command": " ".join(["python", *sys.argv]), "blocks": n,
              "threads": args.threads, "runs": args.runs, "meminfo": thp,
              "MBps_median": {k: round(statistics.median(v)) for k, v in got.items()},
              "MBps_all": {k: [round(x) for x in v] for k, v in got.items()}}
    for k, v in result["MBps_median"].items():
        print(f"{k:<26} {v:>6} MB/s")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.json)


if __name__ == "__main__":
    main()
