"""Two processes on one root: shared capacity (never above the bound plus one job
per writer), no collisions, no double counting, and blocks one writes become
visible to the other through the probe (RETRY, then HIT)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import resolve_lookup

from tests.fs.child import read_log, writer
from tests.fs.helpers import FILE, context, disk_files, load_and_check, ns_dir, open_tier


def test_two_processes_share_one_capacity(mp: Any, children: list[Any],
                                          tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    capacity = 40  # blocks
    ctx = context()
    observer = open_tier(ctx, root, capacity)  # a third process' view, in ours
    queue = mp.Queue()
    procs = []
    for i in range(2):
        ready = mp.Event()
        # Overlapping key space: both store some of the same keys at the same time.
        p = mp.Process(target=writer, args=(str(root), capacity, i, str(tmp_path / f"log{i}"),
                                            ready),
                       kwargs={"jobs": 60, "key_space": 400, "result_queue": queue,
                               "in_flight": 2})
        children.append(p)
        procs.append((p, ready))
        p.start()
    try:
        for _, ready in procs:
            assert ready.wait(30)
        bound = capacity * FILE + 2 * 8 * FILE  # one job (<= 8 blocks) per writer
        worst = 0
        while any(p.is_alive() for p, _ in procs):
            blocks, nbytes, tmps = disk_files(ns_dir(root, ctx))
            worst = max(worst, nbytes + tmps * FILE)
            time.sleep(0.002)
        for p, _ in procs:
            p.join(30)
            assert p.exitcode == 0
        assert worst <= bound, f"disk held {worst} bytes, bound {bound}"
        reports = [queue.get(timeout=10) for _ in procs]
        assert all(r["evictions"] > 0 for r in reports), reports
        assert all(not r["errors"] for r in reports), reports

        # The observer learns what they wrote through the probe.
        logged = read_log(str(tmp_path / "log0")) + read_log(str(tmp_path / "log1"))
        # (Not "the last keys logged": the writer that ran longer may have evicted
        # all of the other's recent blocks.)
        on_disk = [k for k in dict.fromkeys(reversed(logged))
                   if os.path.exists(observer.block_path(k))][:10]
        assert on_disk, "no block of the writers is on disk"
        assert observer.lookup(on_disk[0]) in (LookupResult.RETRY, LookupResult.HIT)
        present = [k for k in on_disk if resolve_lookup(observer, k) is LookupResult.HIT]
        assert present == on_disk, "blocks written by other processes never became visible"
        assert load_and_check(observer, present).success
        usage = observer.stats().usage_bytes
        blocks, nbytes, tmps = disk_files(ns_dir(root, ctx))
        assert usage == nbytes and tmps == 0 and usage <= capacity * FILE
        assert blocks == len({k for k in logged if observer.stores[0].contains(k)})
    finally:
        observer.close()
    fresh = open_tier(context(), root, capacity)
    try:
        assert fresh.stats().usage_bytes == disk_files(ns_dir(root, ctx))[1]
    finally:
        fresh.close()
