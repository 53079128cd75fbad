"""Conformance tests of the capacity bound and of eviction.

What every bounded policy guarantees is asserted always: usage within the bound,
every block that left counted, a store job never evicting its own blocks (new or
already present), the newest block kept. Which block goes first is asserted only
when the order is known: `make_tier` takes `eviction_policy` (the tests ask for
"lru"), or the class's `eviction_order` is "lru" (the default).
"""

from __future__ import annotations

from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing._base import TierSuiteBase
from kvtiers.testing._helpers import (
    check_blocks,
    fill_slots,
    poison_slots,
    random_keys,
    resident,
    resolve_lookup,
)

#: capacity, in blocks of `block_bytes`, of the tiers these tests fill
BOUND = 4


class EvictionTests(TierSuiteBase):
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
        assert stats.errors.get(FailureReason.FULL.value, 0) == 1, stats.errors

    def test_capacity_bound_evicts_oldest(self) -> None:
        ctx = self.new_context()
        bound = 2 * BOUND
        tier = self.new_tier(ctx, capacity_bytes=bound * self.block_bytes, lru=True)
        jobs = self.new_tracker(tier)
        keys = random_keys(3 * bound)
        # One by one: the order of stores is the order of age.
        data = jobs.store_each(keys[:1])
        per_block = tier.stats().usage_bytes
        assert per_block > 0, "usage did not grow with a stored block"
        data.update(jobs.store_each(keys[1:]))
        stats = tier.stats()
        assert stats.capacity_bytes is not None, "stats must report the capacity bound"
        assert 0 < stats.capacity_bytes <= bound * self.block_bytes
        assert 0 < stats.usage_bytes <= stats.capacity_bytes
        hits = [resolve_lookup(tier, k, self.timeout_s) is LookupResult.HIT for k in keys]
        assert hits[-1], "the newest block was evicted"
        assert 1 <= sum(hits) <= bound
        assert stats.evictions == len(keys) - sum(hits), (
            f"{len(keys) - sum(hits)} blocks left the tier, {stats.evictions} evictions counted")
        assert stats.usage_bytes == sum(hits) * per_block, (
            f"usage {stats.usage_bytes} for {sum(hits)} blocks of {per_block} bytes each")
        if self.order_known():
            assert not hits[0], "the oldest block survived overfilling"
            assert hits == sorted(hits), f"an older block outlived a newer one: {hits}"
        poison_slots(ctx.pool, [1])
        assert jobs.run_load([keys[-1]], [1]).success
        check_blocks(ctx.pool, [(1, data[keys[-1]])])

    def test_store_job_never_evicts_its_own_new_blocks(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx, capacity_bytes=BOUND * self.block_bytes)
        jobs = self.new_tracker(tier)
        n = 3 * BOUND  # one job, three times what the tier holds
        keys = random_keys(n)
        data = dict(zip(keys, fill_slots(ctx.pool, range(n)), strict=True))
        result = jobs.run_store(keys, range(n))
        assert result.ok, f"a job larger than the tier stored nothing: {result.failed}"
        assert set(result.failed.values()) <= {FailureReason.FULL}, result.failed
        assert tier.stats().evictions == 0, "an empty tier evicted: the job's own blocks"
        assert resident(tier, keys, self.timeout_s) == [k for k in keys if k in result.ok], (
            "a key reported ok is not in the tier: the job evicted its own block")
        dst = list(range(n, n + len(result.ok)))
        poison_slots(ctx.pool, dst)
        assert jobs.run_load(result.ok, dst).success
        check_blocks(ctx.pool, [(s, data[k]) for k, s in zip(result.ok, dst, strict=True)])

    def test_store_job_never_evicts_its_present_blocks(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx, capacity_bytes=BOUND * self.block_bytes)
        jobs = self.new_tracker(tier)
        keys = random_keys(BOUND + 2)
        data = jobs.store_each(keys)  # full: the last stores evicted
        held = resident(tier, keys, self.timeout_s)
        assert held, "a full tier holds nothing"
        # One job: every block the tier holds (present: nothing to copy), then new
        # blocks that need room. The only blocks to evict are the job's own.
        fresh = random_keys(BOUND)
        job_keys = held + fresh
        slots = list(range(len(job_keys)))
        new_data = dict(zip(job_keys, fill_slots(ctx.pool, slots), strict=True))
        result = jobs.run_store(job_keys, slots)
        assert set(held) <= set(result.ok), f"a present key failed: {result.failed}"
        assert set(result.failed.values()) <= {FailureReason.FULL}, result.failed
        ok_fresh = [k for k in fresh if k in result.ok]
        assert resident(tier, held, self.timeout_s) == held, (
            "a store job evicted a block it reported ok as already present")
        assert resident(tier, ok_fresh, self.timeout_s) == ok_fresh, (
            "a store job evicted its own new block")
        dst = list(range(32, 32 + len(held) + len(ok_fresh)))
        poison_slots(ctx.pool, dst)
        assert jobs.run_load(held + ok_fresh, dst).success
        want = [data[k] for k in held] + [new_data[k] for k in ok_fresh]
        check_blocks(ctx.pool, zip(dst, want, strict=True))

    def test_touch_refreshes_recency(self) -> None:
        self.require_order()
        ctx = self.new_context()
        tier = self.new_tier(ctx, capacity_bytes=BOUND * self.block_bytes, lru=True)
        jobs = self.new_tracker(tier)
        keys = random_keys(BOUND + 2)
        data = jobs.store_each(keys)
        held = resident(tier, keys, self.timeout_s)
        assert len(held) >= 2, f"a tier of {BOUND} blocks holds {len(held)}"
        oldest, next_oldest = held[0], held[1]
        absent = random_keys(1)[0]
        tier.touch([oldest, absent])  # an absent key is ignored
        assert resolve_lookup(tier, absent, self.timeout_s) is LookupResult.MISS
        jobs.store_each(random_keys(1), slot=1)  # full: evicts the least recently used
        assert resolve_lookup(tier, oldest, self.timeout_s) is LookupResult.HIT, (
            "the touched block was evicted: touch is ignored")
        assert resolve_lookup(tier, next_oldest, self.timeout_s) is LookupResult.MISS, (
            "the least recently used block survived a store into a full tier")
        poison_slots(ctx.pool, [2])
        assert jobs.run_load([oldest], [2]).success
        check_blocks(ctx.pool, [(2, data[oldest])])

    def test_load_refreshes_recency(self) -> None:
        self.require_order()
        ctx = self.new_context()
        tier = self.new_tier(ctx, capacity_bytes=BOUND * self.block_bytes, lru=True)
        jobs = self.new_tracker(tier)
        keys = random_keys(BOUND + 2)
        jobs.store_each(keys)
        held = resident(tier, keys, self.timeout_s)
        assert len(held) >= 2, f"a tier of {BOUND} blocks holds {len(held)}"
        oldest, next_oldest = held[0], held[1]
        assert jobs.run_load([oldest], [2]).success  # a load is a use
        jobs.store_each(random_keys(1), slot=1)
        assert resolve_lookup(tier, oldest, self.timeout_s) is LookupResult.HIT, (
            "a block just loaded was evicted first: a load must refresh recency")
        assert resolve_lookup(tier, next_oldest, self.timeout_s) is LookupResult.MISS
