"""Conformance tests every tier must pass, whatever its capabilities."""

from __future__ import annotations

import json
import random

from kvtiers.jobs import FailureReason
from kvtiers.lookup import LookupResult
from kvtiers.testing._base import TierSuiteBase
from kvtiers.testing._helpers import (
    expected_pool,
    fill_slots,
    poison_slots,
    random_keys,
    resolve_lookup,
    snapshot,
)

_OK_AT_CLOSE = {FailureReason.CLOSED, FailureReason.IO}


class CoreTests(TierSuiteBase):
    def test_store_then_load_round_trip(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        bb, n = self.block_bytes, 8
        keys = random_keys(n)
        src = list(range(n))
        data = dict(zip(keys, fill_slots(ctx.pool, src), strict=True))
        before = snapshot(ctx.pool)
        stored = jobs.run_store(keys, src)
        assert stored.success, f"store failed: {stored.failed}"
        assert stored.bytes_moved == n * bb
        assert snapshot(ctx.pool) == before, "a store wrote into the pool"

        order = keys[::-1]  # other keys in other slots than they came from
        dst = list(range(n, 2 * n))
        poison_slots(ctx.pool, dst)
        before = snapshot(ctx.pool)
        loaded = jobs.run_load(order, dst)
        assert loaded.success, f"load failed: {loaded.failed}"
        assert loaded.bytes_moved == n * bb
        for key, slot in zip(order, dst, strict=True):
            assert bytes(ctx.pool.block(slot)) == data[key], f"wrong bytes in slot {slot}"
        loaded_blocks = {s: data[k] for k, s in zip(order, dst, strict=True)}
        want = expected_pool(ctx.pool, before, loaded_blocks)
        assert snapshot(ctx.pool) == want, "a load wrote outside its blocks"

    def test_lookup_hit_and_miss(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        stored, absent = random_keys(2)
        assert resolve_lookup(tier, stored, self.timeout_s) is LookupResult.MISS
        fill_slots(ctx.pool, [0])
        assert self.new_tracker(tier).run_store([stored], [0]).success
        assert resolve_lookup(tier, stored, self.timeout_s) is LookupResult.HIT
        assert resolve_lookup(tier, absent, self.timeout_s) is LookupResult.MISS

    def test_store_of_present_keys_succeeds_without_copying(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        keys = random_keys(4)
        first = fill_slots(ctx.pool, range(4))
        assert jobs.run_store(keys, range(4)).success
        fill_slots(ctx.pool, range(4))  # other bytes under the same keys
        again = jobs.run_store(keys, range(4))
        assert again.success and again.bytes_moved == 0, again
        poison_slots(ctx.pool, range(8, 12))
        assert jobs.run_load(keys, range(8, 12)).success
        for i, slot in enumerate(range(8, 12)):
            assert bytes(ctx.pool.block(slot)) == first[i], "a present key was overwritten"

    def test_load_of_missing_key_fails_alone(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        there, missing, also = random_keys(3)
        data = fill_slots(ctx.pool, [0, 1])
        assert jobs.run_store([there, also], [0, 1]).success
        poison_slots(ctx.pool, [10, 11, 12])
        untouched = bytes(ctx.pool.block(11))
        result = jobs.run_load([there, missing, also], [10, 11, 12])
        assert sorted(result.ok) == sorted([there, also])
        assert result.failed == {missing: FailureReason.MISSING}
        assert result.bytes_moved == 2 * self.block_bytes
        assert bytes(ctx.pool.block(10)) == data[0]
        assert bytes(ctx.pool.block(12)) == data[1]
        assert bytes(ctx.pool.block(11)) == untouched, "the slot of a missing key was written"

    def test_store_larger_than_capacity_fails_full(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx, capacity_bytes=self.block_bytes // 2)
        key = random_keys(1)[0]
        fill_slots(ctx.pool, [0])
        result = self.new_tracker(tier).run_store([key], [0])
        assert result.failed == {key: FailureReason.FULL}
        assert resolve_lookup(tier, key, self.timeout_s) is LookupResult.MISS
        stats = tier.stats()
        assert stats.usage_bytes <= (stats.capacity_bytes or 0) <= self.block_bytes // 2

    def test_capacity_bound_evicts_oldest(self) -> None:
        ctx = self.new_context()
        bound = 8
        tier = self.new_tier(ctx, capacity_bytes=bound * self.block_bytes)
        jobs = self.new_tracker(tier)
        keys = random_keys(3 * bound)
        data = {}
        for key in keys:  # one by one: the order of stores is the order of age
            data[key] = fill_slots(ctx.pool, [0])[0]
            result = jobs.run_store([key], [0])
            assert result.success, f"a full tier must evict to store: {result.failed}"
        stats = tier.stats()
        assert stats.capacity_bytes is not None, "stats must report the capacity bound"
        assert 0 < stats.capacity_bytes <= bound * self.block_bytes
        assert 0 < stats.usage_bytes <= stats.capacity_bytes
        assert stats.evictions >= len(keys) - bound
        hits = [resolve_lookup(tier, k, self.timeout_s) is LookupResult.HIT for k in keys]
        assert not hits[0], "the oldest block survived overfilling"
        assert hits[-1], "the newest block was evicted"
        assert 1 <= sum(hits) <= bound
        poison_slots(ctx.pool, [1])
        assert jobs.run_load([keys[-1]], [1]).success
        assert bytes(ctx.pool.block(1)) == data[keys[-1]]

    def test_stats_count_blocks_and_bytes(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        bb, n = self.block_bytes, 4
        keys = random_keys(n + 1)
        fill_slots(ctx.pool, range(n))
        assert jobs.run_store(keys[:n], range(n)).success
        assert jobs.run_load(keys[:n], range(n, 2 * n)).success
        assert jobs.run_load([keys[n]], [2 * n]).failed == {keys[n]: FailureReason.MISSING}
        assert resolve_lookup(tier, keys[0], self.timeout_s) is LookupResult.HIT
        assert resolve_lookup(tier, keys[n], self.timeout_s) is LookupResult.MISS
        s = tier.stats()
        assert s.blocks_written >= n and s.bytes_written >= n * bb
        assert s.blocks_read >= n and s.bytes_read >= n * bb
        assert s.hits >= 1 and s.misses >= 1
        assert s.errors.get(FailureReason.MISSING.value, 0) >= 1
        assert s.usage_bytes >= 1
        numbers = [v for v in s.as_dict().values() if isinstance(v, (int, float))]
        assert all(v >= 0 for v in numbers), s
        json.dumps(s.as_dict())  # JSON-ready

    def test_empty_jobs_are_reported(self) -> None:
        tier = self.new_tier()
        jobs = self.new_tracker(tier)
        for result in (jobs.run_store([], []), jobs.run_load([], [])):
            assert result.ok == [] and result.failed == {} and result.bytes_moved == 0

    def test_drain_waits_for_submitted_jobs(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        assert tier.drain(self.timeout_s) is True, "drain of an idle tier"
        jobs = self.new_tracker(tier)
        keys = random_keys(10)
        fill_slots(ctx.pool, range(10))
        submitted = [jobs.store([k], [i]) for i, k in enumerate(keys)]
        assert tier.drain(self.timeout_s) is True
        jobs.poll()
        assert not jobs.outstanding, "results must be ready once drain returned True"
        assert all(jobs.results[j.job_id].success for j in submitted)

    def test_close_is_idempotent_and_later_jobs_fail_closed(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        old, new = random_keys(2)
        fill_slots(ctx.pool, [0, 1])
        assert jobs.run_store([old], [0]).success
        tier.close()
        tier.close()
        stored = jobs.store([new], [1])
        loaded = jobs.load([old], [2])
        for result in jobs.wait([stored, loaded]):
            assert set(result.failed.values()) == {FailureReason.CLOSED}, result
        assert tier.lookup(old) in LookupResult  # answers, never raises
        tier.stats()
        assert tier.drain(self.timeout_s) is True

    def test_close_reports_every_pending_job_once(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        keys = random_keys(20)
        fill_slots(ctx.pool, range(20))
        submitted = [jobs.store([k], [i]) for i, k in enumerate(keys)]
        tier.close()
        for result in jobs.wait(submitted):  # each exactly once: the tracker checks
            assert set(result.failed.values()) <= _OK_AT_CLOSE, result
        assert tier.drain(self.timeout_s) is True

    def test_many_concurrent_jobs(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        n = min(50, self.num_slots)
        keys = random_keys(n)
        data = dict(zip(keys, fill_slots(ctx.pool, range(n)), strict=True))
        stores = [jobs.store([k], [i]) for i, k in enumerate(keys)]
        for result in jobs.wait(stores):
            assert result.success, result.failed
        poison_slots(ctx.pool, range(n))
        slots = list(range(n))
        random.Random(7).shuffle(slots)
        loads = [jobs.load([k], [s]) for k, s in zip(keys, slots, strict=True)]
        for result in jobs.wait(loads):
            assert result.success, result.failed
        for key, slot in zip(keys, slots, strict=True):
            assert bytes(ctx.pool.block(slot)) == data[key], f"wrong bytes in slot {slot}"
