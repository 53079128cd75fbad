"""The server going away: killed with kill -9 mid-job, hung (SIGSTOP), restarted
empty. Every job still ends - with misses (`io`, `timeout`) and within its
deadline, never a hang and never a touched slot - and the tier recovers once the
server is back. The tier runs on the real clock here, so deadlines are real."""

from __future__ import annotations

import time
from pathlib import Path

from kvtiers import FailureReason, LookupResult
from kvtiers.testing import (
    GatedPool,
    JobTracker,
    check_blocks,
    fill_slots,
    poison_slots,
    random_keys,
    snapshot,
    wait_until,
)

from tests.redis.helpers import BLOCK, SLOTS, Tiers, context
from tests.redis.server import RedisServer

MISSES = {FailureReason.IO, FailureReason.TIMEOUT}


def test_server_killed_mid_job_costs_misses_then_recovers(server: RedisServer,
                                                           tiers: Tiers) -> None:
    pool = GatedPool(SLOTS, BLOCK, hold_s=30)
    ctx = context(pool=pool, clock=time.monotonic)
    tier = tiers.open(ctx, capacity_blocks=32, timeout_s=30)
    jobs = JobTracker(tier, timeout_s=60)
    kept = random_keys(6)
    kept_data = fill_slots(pool, range(6))
    assert jobs.run_store(kept, range(6)).success

    # A store held while it copies its first slot; the server dies under it.
    fresh = random_keys(6)
    fill_slots(pool, range(8, 14))
    with pool.gate([8]) as gate:
        store = jobs.store(fresh, range(8, 14), deadline=time.monotonic() + 20)
        gate.wait_entered(30, "the store")
        server.kill()
    [result] = jobs.wait([store])
    assert result.failed and set(result.failed.values()) <= MISSES, result

    # With the server gone: loads are misses, fast, and touch no slot.
    poison_slots(pool, range(16, 22))
    before = snapshot(pool)
    result = jobs.run_load(kept, range(16, 22), deadline=time.monotonic() + 20)
    assert set(result.failed) == set(kept) and set(result.failed.values()) <= MISSES, result
    assert snapshot(pool) == before, "a failed load touched the pool"
    assert tier.stats().errors.get("redis.load.ConnectionError", 0) >= 1

    # Back (the append-only file kept every acknowledged SET): served again.
    server.start()
    poison_slots(pool, range(16, 22))
    assert jobs.run_load(kept, range(16, 22)).success
    check_blocks(pool, zip(range(16, 22), kept_data, strict=True), "after the restart")
    # What failed to store was never committed: misses, and storable again.
    assert [tier.lookup(k) for k in fresh] == [LookupResult.MISS] * 6
    again = fill_slots(pool, range(8, 14))
    assert jobs.run_store(fresh, range(8, 14)).success
    poison_slots(pool, range(24, 30))
    assert jobs.run_load(fresh, range(24, 30)).success
    check_blocks(pool, zip(range(24, 30), again, strict=True), "stored after the restart")


def test_a_hung_server_costs_timeouts_at_the_deadline(server: RedisServer,
                                                      tiers: Tiers) -> None:
    ctx = context(clock=time.monotonic)
    # timeout_s far beyond the jobs' deadlines: the deadline is what ends them.
    tier = tiers.open(ctx, timeout_s=600)
    jobs = JobTracker(tier, timeout_s=60)
    keys = random_keys(4)
    data = fill_slots(ctx.pool, range(4))
    assert jobs.run_store(keys, range(4)).success

    server.pause()
    try:
        poison_slots(ctx.pool, range(8, 12))
        before = snapshot(ctx.pool)
        load = jobs.load(keys, range(8, 12), deadline=time.monotonic() + 1.0)
        fill_slots(ctx.pool, [12, 13])
        store = jobs.store(random_keys(2), [12, 13], deadline=time.monotonic() + 1.0)
        for result in jobs.wait([load, store]):
            assert set(result.failed.values()) == {FailureReason.TIMEOUT}, result
        after = snapshot(ctx.pool)
        assert after[: 8 * ctx.pool.slot_bytes] == before[: 8 * ctx.pool.slot_bytes]
        assert after[8 * ctx.pool.slot_bytes : 12 * ctx.pool.slot_bytes] == before[
            8 * ctx.pool.slot_bytes : 12 * ctx.pool.slot_bytes], "a timed-out load wrote"
    finally:
        server.resume()
    poison_slots(ctx.pool, range(8, 12))
    assert jobs.run_load(keys, range(8, 12)).success
    check_blocks(ctx.pool, zip(range(8, 12), data, strict=True), "after the hang")


def test_a_server_restarted_empty_costs_misses_once(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "volatile")  # nothing persisted
    server.start()
    tiers = Tiers(server)
    try:
        ctx = context(clock=time.monotonic)
        tier = tiers.open(ctx)
        jobs = JobTracker(tier, timeout_s=60)
        keys = random_keys(4)
        fill_slots(ctx.pool, range(4))
        assert jobs.run_store(keys, range(4)).success
        server.kill()
        server.start()
        result = jobs.run_load(keys, range(8, 12))
        assert result.failed == dict.fromkeys(keys, FailureReason.MISSING), result
        assert [tier.lookup(k) for k in keys] == [LookupResult.MISS] * 4
        assert tier.stats().usage_bytes == 0
        data = fill_slots(ctx.pool, range(4))
        assert jobs.run_store(keys, range(4)).success
        poison_slots(ctx.pool, range(8, 12))
        assert jobs.run_load(keys, range(8, 12)).success
        check_blocks(ctx.pool, zip(range(8, 12), data, strict=True))
    finally:
        tiers.close_all()
        server.stop()


def test_a_tier_started_without_its_server_serves_once_it_answers(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "late", durable=True)
    server.start()
    first = Tiers(server)
    ctx = context(clock=time.monotonic)
    keys = random_keys(3)
    data = fill_slots(ctx.pool, range(3))
    try:
        assert JobTracker(first.open(ctx)).run_store(keys, range(3)).success
    finally:
        first.close_all()
    server.kill()

    tiers = Tiers(server)
    try:
        tier = tiers.open(context(clock=time.monotonic), timeout_s=2)  # no error: misses
        jobs = JobTracker(tier, timeout_s=60)
        assert [tier.lookup(k) for k in keys] == [LookupResult.MISS] * 3
        result = jobs.run_store(random_keys(2), [0, 1], deadline=time.monotonic() + 10)
        assert set(result.failed.values()) <= MISSES and len(result.failed) == 2, result
        server.start()
        wait_until(lambda: all(tier.lookup(k) is LookupResult.HIT for k in keys),
                   "the tier scanning the server once it answers", 30)
        poison_slots(tier.ctx.pool, range(8, 11))
        assert jobs.run_load(keys, range(8, 11)).success
        check_blocks(tier.ctx.pool, zip(range(8, 11), data, strict=True))
    finally:
        tiers.close_all()
        server.stop()
