"""Engines in separate processes on one master: one stores, the other finds the
blocks by probing (`batch_is_exist`), promotes and verifies them; and when the
process whose segment holds them is killed (-9), its blocks are misses, never
wrong bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers import FailureReason, LookupResult
from kvtiers.testing import JobTracker, check_blocks, poison_slots, resolve_lookup, wait_until

from tests.mooncake.engine_child import blocks
from tests.mooncake.helpers import Tiers, context
from tests.mooncake.master import Master
from tests.mooncake.netns import NetNamespace

REPO = Path(__file__).resolve().parents[2]
N = 12


class Child:
    def __init__(self, ns: NetNamespace, master: Master, prefix: str, seed: int, mode: str):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            ns.command(sys.executable, "-m", "tests.mooncake.engine_child", master.address,
                       prefix, str(seed), str(N), mode),
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def finish(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.kill()


def test_a_block_stored_by_one_process_is_promoted_by_another(
        ns: NetNamespace, master: Master, tiers: Tiers, children: list[Child]) -> None:
    writer = Child(ns, master, tiers.prefix, 7, "store")
    children.append(writer)
    assert writer.line() == "stored"
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=N)
    made = blocks(7, N, ctx.block_bytes)
    assert tier.lookup(made[0][0]) is LookupResult.RETRY  # not ours: probed
    for key, _ in made:
        assert resolve_lookup(tier, key) is LookupResult.HIT
    poison_slots(ctx.pool, range(N))
    result = JobTracker(tier).run_load([k for k, _ in made], range(N))
    assert result.success, result.failed
    check_blocks(ctx.pool, [(s, d) for s, (_, d) in enumerate(made)])
    assert tier.stats().usage_bytes == 0  # another engine's blocks: not our quota
    # and the other way round: ours, loaded by a fresh process
    mine = blocks(8, N, ctx.block_bytes)
    for slot, (_, data) in enumerate(mine):
        ctx.pool.block(slot)[:] = data
    assert JobTracker(tier).run_store([k for k, _ in mine], range(N)).success
    reader = Child(ns, master, tiers.prefix, 8, "load")
    children.append(reader)
    assert reader.line() == f"loaded {N}"
    assert reader.proc.wait(60) == 0
    assert writer.finish() == 0


def test_blocks_of_a_killed_segment_owner_are_misses_never_wrong_bytes(
        ns: NetNamespace, master: Master, tiers: Tiers, children: list[Child]) -> None:
    writer = Child(ns, master, tiers.prefix, 9, "store")
    children.append(writer)
    assert writer.line() == "stored"
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=N)
    made = blocks(9, N, ctx.block_bytes)
    keys = [k for k, _ in made]
    for key in keys:
        assert resolve_lookup(tier, key) is LookupResult.HIT
    writer.kill()  # kill -9: its segment, which holds the blocks, is gone
    jobs = JobTracker(tier)
    for attempt in range(3):
        poison_slots(ctx.pool, range(N))
        before = [bytes(ctx.pool.block(s)) for s in range(N)]
        result = jobs.run_load(keys, range(N))
        assert not result.ok, f"attempt {attempt}: blocks of a dead segment loaded"
        assert set(result.failed.values()) <= {FailureReason.MISSING, FailureReason.IO}
        for slot in range(N):
            assert bytes(ctx.pool.block(slot)) in (before[slot], made[slot][1]), \
                "a slot holds bytes that are neither the block nor what was there"
    # The tier's own blocks still go through once the breaker lets calls through.
    mine = blocks(10, 4, ctx.block_bytes)
    for slot, (_, data) in enumerate(mine):
        ctx.pool.block(slot)[:] = data

    def stored() -> bool:
        return JobTracker(tier).run_store([k for k, _ in mine], range(4)).success

    wait_until(stored, "stores after the segment owner died", 30)
    poison_slots(ctx.pool, range(8, 12))
    assert JobTracker(tier).run_load([k for k, _ in mine], range(8, 12)).success
    check_blocks(ctx.pool, [(8 + s, d) for s, (_, d) in enumerate(mine)])
