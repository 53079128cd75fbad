"""A store of a block that another writer is writing at that moment (issue 11,
item 1): never reported stored before a complete copy is committed - by the other
writer, or by this one once the other has failed or died. Real processes: the
other writer stops itself (SIGSTOP) right after creating its temporary file, and is
resumed (SIGCONT) or killed (SIGKILL)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import JobTracker, random_keys, resolve_lookup, wait_until

from tests.fs.child import read_log, stop_while_writing
from tests.fs.helpers import (
    BB,
    FILE,
    block_data,
    context,
    disk_files,
    load_and_check,
    ns_dir,
    open_tier,
)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _start_stopped_writer(mp: Any, children: list[Any], root: Path, keys: list[bytes],
                          log: Path) -> Any:
    """A writer process that has created the temporary file of keys[0] and is
    stopped (SIGSTOP) before writing a byte of it."""
    ready = mp.Event()
    proc = mp.Process(target=stop_while_writing, args=(str(root), keys, BB, str(log), ready),
                      daemon=True)
    children.append(proc)
    proc.start()
    assert ready.wait(30), "the writer did not start"
    deadline = time.monotonic() + 30
    while not _stopped(proc.pid):
        assert time.monotonic() < deadline, "the writer never stopped"
        time.sleep(0.005)
    # It stops itself only once its temporary file exists; a stop for any other
    # reason leaves no such file (then say what the process was doing).
    deadline = time.monotonic() + 5
    while disk_files(ns_dir(root, context()))[2] != 1:
        if time.monotonic() > deadline:
            with open(f"/proc/{proc.pid}/stat") as f:
                state = f.read()
            raise AssertionError(f"no temporary file of the writer; its /proc stat: {state}; "
                                 f"files: {sorted(p.name for p in root.rglob('*'))}")
        time.sleep(0.01)
    return proc


def _store(tier: Any, key: bytes, slot: int, **kw: Any) -> Any:
    tier.ctx.pool.block(slot)[:] = block_data(key)
    return JobTracker(tier).store([key], [slot], **kw)


def _unfinished_for_a_while(tier: Any, steps: int = 50) -> bool:
    """No job of `tier` ends over `steps` polls (it cannot end: the other writer is
    stopped; the polls give a wrong early success every chance to show)."""
    for _ in range(steps):
        if tier.get_finished_jobs():
            return False
        time.sleep(0.004)
    return True


def test_the_store_waits_for_the_other_writers_commit(mp: Any, children: list[Any],
                                                      tmp_path: Path) -> None:
    key = random_keys(1)[0]
    proc = _start_stopped_writer(mp, children, tmp_path, [key], tmp_path / "log")
    tier = open_tier(context(), tmp_path)
    try:
        jobs = JobTracker(tier)
        tier.ctx.pool.block(3)[:] = block_data(key)
        job = jobs.store([key], [3])
        assert _unfinished_for_a_while(tier), "reported stored while the other write was stopped"
        assert resolve_lookup(tier, key) is LookupResult.MISS
        usage = tier.inventory()
        assert (usage.reserved_blocks, usage.reserved_bytes) == (1, FILE)  # the other's intent
        os.kill(proc.pid, signal.SIGCONT)
        (result,) = jobs.wait([job])
        assert result.ok == [key] and result.bytes_moved == 0  # the other writer's copy
        proc.join(30)
        assert proc.exitcode == 0 and read_log(str(tmp_path / "log")) == [key]
        assert load_and_check(tier, [key]).ok == [key]
        assert tier.inventory().reserved_blocks == 0
    finally:
        tier.close()


def test_the_store_writes_the_block_itself_when_the_other_writer_is_killed(
        mp: Any, children: list[Any], tmp_path: Path) -> None:
    key, other = random_keys(2)
    proc = _start_stopped_writer(mp, children, tmp_path, [key, other], tmp_path / "log")
    tier = open_tier(context(), tmp_path)
    try:
        jobs = JobTracker(tier)
        tier.ctx.pool.block(3)[:] = block_data(key)
        job = jobs.store([key], [3])
        assert _unfinished_for_a_while(tier)
        proc.kill()
        proc.join(10)
        (result,) = jobs.wait([job])
        assert result.ok == [key] and result.bytes_moved == BB  # written by us, after all
        assert read_log(str(tmp_path / "log")) == []
    finally:
        tier.close()
    again = open_tier(context(), tmp_path)
    try:
        assert load_and_check(again, [key]).ok == [key]
        assert resolve_lookup(again, other) is LookupResult.MISS
        inv = again.inventory()
        assert inv.keys() == {key} and inv.reserved_blocks == 0
        assert disk_files(ns_dir(tmp_path, again)) == (1, FILE, 0)
    finally:
        again.close()


def test_the_store_times_out_while_the_other_writer_stays_stopped(
        mp: Any, children: list[Any], tmp_path: Path) -> None:
    key = random_keys(1)[0]
    proc = _start_stopped_writer(mp, children, tmp_path, [key], tmp_path / "log")
    clock = ManualClock()
    tier = open_tier(context(clock=clock), tmp_path)
    try:
        jobs = JobTracker(tier)
        tier.ctx.pool.block(3)[:] = block_data(key)
        job = jobs.store([key], [3], deadline=clock() + 5)
        assert _unfinished_for_a_while(tier, 10)
        clock.advance(10)
        (result,) = jobs.wait([job])
        assert result.failed == {key: FailureReason.TIMEOUT}
        assert resolve_lookup(tier, key) is LookupResult.MISS
        # The stopped writer's intent is untouched: it resumes and commits its block.
        assert tier.inventory().reserved_blocks == 1
        os.kill(proc.pid, signal.SIGCONT)
        proc.join(30)
        assert proc.exitcode == 0 and read_log(str(tmp_path / "log")) == [key]
        clock.advance(2)  # past the probe's cached miss
        assert resolve_lookup(tier, key) is LookupResult.HIT
        assert load_and_check(tier, [key]).ok == [key]
    finally:
        tier.close()


def test_two_jobs_of_one_process_storing_one_key(tmp_path: Path) -> None:
    """The second job's store waits for the first job's intent (one store thread:
    the first job is reserved, not yet written, when the second reserves)."""
    tier = open_tier(context(), tmp_path, threads={"load": 1, "store": 1})
    key = random_keys(1)[0]
    try:
        jobs = JobTracker(tier)
        for slot in (0, 1):
            tier.ctx.pool.block(slot)[:] = block_data(key)
        first, second = jobs.store([key], [0]), jobs.store([key], [1])
        r1, r2 = jobs.wait([first, second])
        assert r1.ok == r2.ok == [key]
        assert r1.bytes_moved + r2.bytes_moved == BB  # one copy written
        assert load_and_check(tier, [key]).ok == [key]
        assert disk_files(ns_dir(tmp_path, tier)) == (1, FILE, 0)
    finally:
        tier.close()


def _waiting_stores(tier: Any, jobs: Any, keys: list[bytes]) -> list[Any]:
    """One store job per key (each of them another writer's intent): more waits
    than the tier has I/O threads."""
    out = []
    for slot, key in enumerate(keys):
        tier.ctx.pool.block(slot)[:] = block_data(key)
        out.append(jobs.store([key], [slot]))
    return out


@pytest.mark.parametrize("other_ends", ["commits", "is_killed"])
def test_stores_waiting_for_another_writer_occupy_no_io_thread(
        mp: Any, children: list[Any], tmp_path: Path, other_ends: str) -> None:
    """Two I/O threads, four stores waiting for a stopped writer's blocks: a store of
    another key (and a load) still run and finish meanwhile - on the old tier every
    thread slept in the wait and they never ran. Then the four end as the other
    writer does: with its copy once it commits, with their own once it is killed."""
    keys = random_keys(4)
    proc = _start_stopped_writer(mp, children, tmp_path, keys, tmp_path / "log")
    tier = open_tier(context(), tmp_path, threads={"load": 1, "store": 1})
    try:
        jobs = JobTracker(tier)
        waiting = _waiting_stores(tier, jobs, keys)
        wait_until(lambda: tier.stores[0].waited == 4, "the four stores waiting", 20)
        fresh = random_keys(2)
        for slot, key in enumerate(fresh, 10):
            tier.ctx.pool.block(slot)[:] = block_data(key)
        (other,) = jobs.wait([jobs.store(fresh, [10, 11])])
        assert other.ok == fresh and other.bytes_moved == 2 * BB
        assert load_and_check(tier, fresh, first_slot=20).ok == fresh  # slots of no job
        assert _unfinished_for_a_while(tier), "a waiting store ended while the writer was stopped"
        if other_ends == "commits":
            os.kill(proc.pid, signal.SIGCONT)
            proc.join(30)
            assert proc.exitcode == 0 and sorted(read_log(str(tmp_path / "log"))) == sorted(keys)
        else:
            proc.kill()
            proc.join(10)
        results = jobs.wait(waiting)
        moved = 0 if other_ends == "commits" else BB  # the other's copies, or our own
        assert [(r.ok, r.bytes_moved) for r in results] == [([k], moved) for k in keys]
        assert load_and_check(tier, keys).ok == keys
        inv = tier.inventory()
        assert inv.keys() == {*keys, *fresh} and inv.reserved_blocks == 0
    finally:
        tier.close()
    assert disk_files(ns_dir(tmp_path, context())) == (6, 6 * FILE, 0)
