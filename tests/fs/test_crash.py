"""Crash torture: real writer processes are killed with SIGKILL at random instants
while they store blocks; after each kill the tier is opened again on the same root.

After every restart: every block a writer was told was stored is found, with its
bytes - also when two writers stored the same keys at the same time, so that one
waited for the other's write in flight; no block the tier serves has wrong bytes
(no torn block); no intent and no temporary file is left; usage equals the bytes
of the complete block files on disk (and, with eviction, stays within capacity)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import kvtiers_fs.namespace.store as store_mod
import pytest

from tests.fs.child import read_log, writer
from tests.fs.helpers import context, disk_files, load_and_check, ns_dir, open_tier

CYCLES = 50
SHARED_CYCLES = 20
BLOCK = 4096  # small blocks: many files and journal records per cycle, little disk
FILE = 4096 + BLOCK


def _kill_cycle(mp: Any, children: list[Any], root: Path, capacity: int, seed: int,
                log: Path, rng: random.Random, **kw: Any) -> None:
    ready = mp.Event()
    proc = mp.Process(target=writer, args=(str(root), capacity, seed, str(log), ready),
                      kwargs={"rotate_bytes": 8192, "block_bytes": BLOCK, **kw}, daemon=True)
    children.append(proc)
    proc.start()
    assert ready.wait(30), "the writer did not start"
    proc.join(rng.uniform(0.0, 0.1))  # a random instant of its work
    proc.kill()
    proc.join(10)
    assert proc.exitcode == -9, f"writer ended on its own: {proc.exitcode}"


def _kill_two_cycle(mp: Any, children: list[Any], root: Path, capacity: int, seed: int,
                    logs: tuple[Path, Path], rng: random.Random, key_base: int) -> None:
    """Two writers storing keys of one small key space (so each often finds the
    other's write of a key in flight), each killed at its own random instant."""
    procs = []
    for i, log in enumerate(logs):
        ready = mp.Event()
        proc = mp.Process(target=writer, args=(str(root), capacity, seed * 2 + i, str(log),
                                               ready),
                          kwargs={"rotate_bytes": 8192, "block_bytes": BLOCK,
                                  "key_space": 96, "key_base": key_base, "in_flight": 3},
                          daemon=True)
        children.append(proc)
        proc.start()
        procs.append((proc, ready))
    for _, ready in procs:
        assert ready.wait(30), "a writer did not start"
    instants = sorted(rng.uniform(0.0, 0.15) for _ in procs)
    start = time.monotonic()
    for (proc, _), at in zip(procs, instants, strict=True):
        time.sleep(max(0.0, at - (time.monotonic() - start)))
        proc.kill()
    for proc, _ in procs:
        proc.join(10)
        assert proc.exitcode == -9, f"writer ended on its own: {proc.exitcode}"


def _check_restart(root: Path, capacity: int, must_have: set[bytes],
                   verified: set[bytes]) -> None:
    ctx = context(BLOCK, slots=64)
    tier = open_tier(ctx, root, capacity)
    try:
        inv = tier.inventory()
        assert inv.reserved_blocks == 0, \
            f"intents of the dead writer were not settled: {inv.reserved_blocks}"
        indexed = inv.keys()
        lost = must_have - indexed
        assert not lost, f"{len(lost)} blocks reported stored were lost"
        # Every indexed block not verified yet must load with the right bytes.
        todo = sorted(indexed - verified)  # (must_have ⊆ indexed was checked above)
        for i in range(0, len(todo), 64):
            batch = todo[i : i + 64]
            result = load_and_check(tier, batch)
            assert result.success, f"blocks not served after a crash: {result.failed}"
        verified |= set(todo)
        blocks, nbytes, tmps = disk_files(ns_dir(root, ctx))
        assert tmps == 0, "temporary files of the dead writer are left"
        usage = tier.stats().usage_bytes
        assert usage == nbytes == blocks * FILE == len(indexed) * FILE
        assert usage <= capacity * FILE
    finally:
        tier.close()


def test_kill_9_at_random_instants_loses_nothing_and_serves_no_torn_block(
    mp: Any, children: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "ROTATE_MIN_BYTES", 8192)  # rotations happen too
    root = tmp_path / "root"
    root.mkdir()
    rng = random.Random(20261130)
    capacity = 1 << 20  # never full: every reported block must survive
    reported: set[bytes] = set()
    verified: set[bytes] = set()
    for cycle in range(CYCLES):
        log = tmp_path / f"log{cycle}"
        _kill_cycle(mp, children, root, capacity, cycle, log, rng)
        reported |= set(read_log(str(log)))
        _check_restart(root, capacity, reported, verified)
    assert len(reported) > CYCLES, "the writer hardly wrote anything: the test tested little"


def test_kill_9_while_evicting_keeps_usage_exact_and_bounded(
    mp: Any, children: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "ROTATE_MIN_BYTES", 8192)
    root = tmp_path / "root"
    root.mkdir()
    rng = random.Random(7)
    capacity = 48
    verified: set[bytes] = set()
    for cycle in range(12):
        _kill_cycle(mp, children, root, capacity, 1000 + cycle, tmp_path / f"log{cycle}", rng)
        _check_restart(root, capacity, set(), verified)


def test_kill_9_of_two_writers_of_the_same_keys_loses_nothing_reported(
    mp: Any, children: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stores of a key the other writer had in flight are reported only once a copy
    is committed; killing either writer at any instant loses none of them."""
    monkeypatch.setattr(store_mod, "ROTATE_MIN_BYTES", 8192)
    root = tmp_path / "root"
    root.mkdir()
    rng = random.Random(11)
    capacity = 1 << 20
    reported: set[bytes] = set()
    verified: set[bytes] = set()
    for cycle in range(SHARED_CYCLES):
        logs = (tmp_path / f"a{cycle}", tmp_path / f"b{cycle}")
        _kill_two_cycle(mp, children, root, capacity, 500 + cycle, logs, rng, cycle * 1000)
        for log in logs:
            reported |= set(read_log(str(log)))
        _check_restart(root, capacity, reported, verified)
    assert len(reported) > SHARED_CYCLES, "the writers hardly wrote anything"
