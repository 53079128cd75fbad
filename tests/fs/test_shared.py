"""Two processes on one root: shared capacity (never above the bound plus one job
per writer), no collisions, no double counting, and blocks one writes become
visible to the other through the probe (RETRY, then HIT)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import random_keys, resolve_lookup
from kvtiers_fs.disk import layout

from tests.fs.child import read_log, store_and_load, writer
from tests.fs.helpers import (
    FILE,
    context,
    disk_files,
    load_and_check,
    ns_dir,
    open_tier,
    store_keys,
)


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


def test_a_load_that_missed_a_block_another_writer_stored_again_keeps_the_new_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window behind a one-block overshoot of the shared bound: writer A's read of
    a key finds no file (writer B evicted it), B stores the key again, then A reads
    the journal - the key is committed, so A took its file for gone behind our back
    and forgot it: B's new file stayed on disk, counted by nobody, one block beyond
    the capacity. A hook runs B's store exactly inside that window."""
    capacity = 8
    ctx = context()
    a, b = open_tier(ctx, tmp_path, capacity), open_tier(context(), tmp_path, capacity)
    try:
        keys = random_keys(capacity)
        assert store_keys(a, keys).success
        key, idn = keys[0], layout.ident(keys[0])
        sa, sb = a.stores[0], b.stores[0]
        sb.sync()
        assert sb.remove(idn, delete_file=True)  # evicted by B: REMOVE, file unlinked
        real_sync = sa.sync

        def b_stores_it_again_first() -> None:
            assert store_keys(b, [key]).success
            real_sync()

        monkeypatch.setattr(sa, "sync", b_stores_it_again_first)
        assert key in load_and_check(a, [key]).failed  # A's read found no file
        monkeypatch.undo()
        assert sa.contains(idn), "a committed copy was forgotten"
        assert load_and_check(a, [key]).success
        more = random_keys(3 * capacity)
        for i in range(0, len(more), 4):
            assert store_keys(a, more[i : i + 4]).success
            assert store_keys(b, more[i + 2 : i + 4]).success
        blocks, nbytes, tmps = disk_files(ns_dir(tmp_path, ctx))
        assert nbytes <= capacity * FILE, f"{blocks} block files, capacity {capacity}"
        sb.sync()
        assert a.stats().usage_bytes == b.stats().usage_bytes == nbytes and tmps == 0
    finally:
        a.close()
        b.close()


def _frozen(pids: list[int]) -> bool:
    """Every thread of every process in `pids` is stopped."""
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except FileNotFoundError:
            continue  # exited (it has written nothing since)
        for task in tasks:
            try:
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, IndexError):
                continue
            if state not in ("T", "t", "Z", "X"):
                return False
    return True


def test_two_writers_that_load_and_store_the_same_keys_never_overshoot_frozen(
        mp: Any, children: list[Any], tmp_path: Path) -> None:
    """Two real processes store and load keys of one small key space (so that one
    evicts and stores again what the other is reading); sampled again and again with
    both frozen (SIGSTOP, every thread stopped), the block files never exceed the
    shared capacity. A load that found no file pauses 20 ms before it reads the
    journal, which makes the window of the test above likely."""
    capacity = 24
    procs = []
    for i in range(2):
        ready = mp.Event()
        p = mp.Process(target=store_and_load, args=(str(tmp_path), capacity, i, 40, ready, 8.0),
                       kwargs={"missed_pause_s": 0.02})
        children.append(p)
        procs.append(p)
        p.start()
        assert ready.wait(30)
    ns = ns_dir(tmp_path, context())
    pids = [p.pid for p in procs]
    samples, worst = 0, 0
    try:
        while all(p.is_alive() for p in procs):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            try:
                while not _frozen(pids):
                    time.sleep(0.0005)
                worst = max(worst, disk_files(ns)[1])
                samples += 1
            finally:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
            time.sleep(0.005)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert samples > 50
    assert worst <= capacity * FILE, f"{worst} bytes of block files, capacity {capacity * FILE}"
    fresh = open_tier(context(), tmp_path, capacity)
    try:
        assert fresh.stats().usage_bytes == disk_files(ns)[1] <= capacity * FILE
    finally:
        fresh.close()
