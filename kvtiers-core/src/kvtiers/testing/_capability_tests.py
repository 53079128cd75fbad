"""Conformance tests of namespaces, deadlines, and each capability flag.

A test for a capability the tier does not declare is skipped, with the reason; a
declared capability whose hook (`restart`, `corrupt`, `sibling`) is missing fails.
"""

from __future__ import annotations

from kvtiers.contract.clock import ManualClock
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.tier import SecondaryTier
from kvtiers.testing._base import TierSuiteBase
from kvtiers.testing._eviction_tests import BOUND
from kvtiers.testing._helpers import (
    check_blocks,
    fill_slots,
    make_namespace,
    poison_slots,
    random_keys,
    resident,
    resolve_lookup,
    snapshot,
)
from kvtiers.testing._usage_tests import check_store_usage, measures_store


class CapabilityTests(TierSuiteBase):
    def _lookups(self, tier: SecondaryTier, keys: list[bytes]) -> list[LookupResult]:
        return [resolve_lookup(tier, k, self.timeout_s) for k in keys]

    def test_namespaces_are_kept_apart(self) -> None:
        ns_a = make_namespace("kvtiers-conformance/model-a", self.block_bytes)
        ns_b = make_namespace("kvtiers-conformance/model-b", self.block_bytes)
        ctx_a = self.new_context(ns_a)
        tier_a = self.new_tier(ctx_a)
        keys = random_keys(4)
        data_a = fill_slots(ctx_a.pool, range(4))
        assert self.new_tracker(tier_a).run_store(keys, range(4)).success
        if not tier_a.shared:  # one process at a time on non-shared storage
            tier_a.close()

        ctx_b = self.new_context(ns_b)
        tier_b = self.new_tier(ctx_b)
        jobs_b = self.new_tracker(tier_b)
        assert self._lookups(tier_b, keys) == [LookupResult.MISS] * 4, "namespace leak"
        result = jobs_b.run_load(keys, range(4))
        assert set(result.failed.values()) == {FailureReason.MISSING}, result
        fill_slots(ctx_b.pool, range(4))  # same keys, other bytes, other namespace
        assert jobs_b.run_store(keys, range(4)).success

        if tier_a.shared:
            survivor = tier_a
        elif tier_a.persistent:
            tier_b.close()
            survivor = self.new_tier(self.new_context(ns_a))
        else:
            return  # separate instances: nothing else can share their blocks
        ctx = survivor.ctx
        poison_slots(ctx.pool, range(8, 12))
        assert self.new_tracker(survivor).run_load(keys, range(8, 12)).success
        for i, slot in enumerate(range(8, 12)):
            assert bytes(ctx.pool.block(slot)) == data_a[i], "another namespace's bytes"

    def test_hung_job_fails_at_its_deadline_without_touching_slots(self) -> None:
        from kvtiers.tiers.faulty import FaultyTier

        ctx = self.new_context()
        tier = self.new_tier(ctx)
        stored, fresh = random_keys(2), random_keys(2)
        fill_slots(ctx.pool, range(4))
        assert self.new_tracker(tier).run_store(stored, [0, 1]).success
        hung = self.adopt(FaultyTier.wrap(tier, hang_rate=1.0, hang_s=None))
        clock = hung.ctx.clock
        assert isinstance(clock, ManualClock), "the tier must run on its context's clock"
        jobs = self.new_tracker(hung)
        poison_slots(ctx.pool, [8, 9])
        before = snapshot(ctx.pool)
        deadline = clock() + 5.0
        load = jobs.load(stored, [8, 9], deadline=deadline)
        store = jobs.store(fresh, [2, 3], deadline=deadline)
        assert jobs.poll() == [], "a hung job ended before its deadline"
        clock.advance(10.0)
        for result in jobs.wait([load, store]):
            assert set(result.failed.values()) == {FailureReason.TIMEOUT}, result
        assert hung.drain(self.timeout_s) is True
        jobs.poll()
        assert snapshot(ctx.pool) == before, "a timed-out job touched the pool"
        assert self._lookups(hung, fresh) == [LookupResult.MISS] * 2

    # persistent

    def test_persistent_contents_and_usage_survive_restart(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        self.require(tier, "persistent")
        keys = random_keys(6)
        data = fill_slots(ctx.pool, range(6))
        assert self.new_tracker(tier).run_store(keys, range(6)).success
        usage = tier.stats().usage_bytes
        ctx2 = self.new_context(ctx.namespace)
        tier = self.adopt(self.call_hook("restart", tier, ctx2))
        assert tier.stats().usage_bytes == usage, "usage changed across a restart"
        assert self._lookups(tier, keys) == [LookupResult.HIT] * 6
        poison_slots(ctx2.pool, range(6))
        assert self.new_tracker(tier).run_load(keys, range(6)).success
        for i in range(6):
            assert bytes(ctx2.pool.block(i)) == data[i]

    def test_persistent_recency_survives_restart(self) -> None:
        self.require_order()
        ctx = self.new_context()
        bound = 4
        tier = self.new_tier(ctx, capacity_bytes=bound * self.block_bytes, lru=True)
        self.require(tier, "persistent")
        jobs = self.new_tracker(tier)
        keys = random_keys(bound + 1)
        for key in keys:  # the last store evicts: the tier is full
            fill_slots(ctx.pool, [0])
            assert jobs.run_store([key], [0]).success
        evicted = tier.stats().evictions
        assert evicted >= 1, "overfilling evicted nothing"

        ctx2 = self.new_context(ctx.namespace)
        tier = self.adopt(self.call_hook("restart", tier, ctx2))
        before = tier.stats().evictions
        newest = random_keys(1)[0]
        fill_slots(ctx2.pool, [0])
        assert self.new_tracker(tier).run_store([newest], [0]).success
        after_restart = tier.stats().evictions - before
        assert after_restart >= 1, "a store into a tier full before its restart evicted nothing"
        evicted += after_restart
        present = self._lookups(tier, keys)
        want = [LookupResult.MISS] * evicted + [LookupResult.HIT] * (len(keys) - evicted)
        assert present == want, (
            "after a restart the least recently stored blocks must go first "
            f"(oldest first: {present}, {evicted} evicted in all)"
        )
        assert resolve_lookup(tier, newest, self.timeout_s) is LookupResult.HIT

    def test_persistent_uses_survive_restart(self) -> None:
        """Recency, not only the order of stores, survives a restart: a block touched
        and one loaded before it outlive blocks stored after them but unused."""
        self.require_order()
        ctx = self.new_context()
        tier = self.new_tier(ctx, capacity_bytes=BOUND * self.block_bytes, lru=True)
        self.require(tier, "persistent")
        jobs = self.new_tracker(tier)
        keys = random_keys(BOUND + 2)
        data = jobs.store_each(keys)  # full: the first stores were evicted
        held = resident(tier, keys, self.timeout_s)  # least recently stored first
        assert len(held) >= 3, f"a tier of {BOUND} blocks holds {len(held)}"
        touched, loaded, unused = held[0], held[1], held[2:]
        tier.touch([touched])
        assert jobs.run_load([loaded], [2]).success  # a load is a use

        ctx2 = self.new_context(ctx.namespace)
        tier = self.adopt(self.call_hook("restart", tier, ctx2))
        jobs = self.new_tracker(tier)
        before = tier.stats().evictions
        for _ in range(len(held)):  # until each unused block had to make room
            if tier.stats().evictions - before >= len(unused):
                break
            jobs.store_each(random_keys(1), slot=1)
        evicted = tier.stats().evictions - before
        assert evicted >= len(unused), (
            f"{len(held)} stores into a tier full before its restart evicted {evicted}")
        present = self._lookups(tier, held)
        want = [LookupResult.HIT, LookupResult.HIT] + [LookupResult.MISS] * len(unused)
        assert present == want, (
            "after a restart, blocks touched or loaded before it must outlive blocks "
            f"stored after them but unused (touched, loaded, unused oldest first: "
            f"{present}): the recency of uses was lost, only the store order kept")
        poison_slots(ctx2.pool, [4, 5])
        assert jobs.run_load([touched, loaded], [4, 5]).success
        check_blocks(ctx2.pool, [(4, data[touched]), (5, data[loaded])])

    # verifies

    def test_corrupt_copy_fails_load_then_misses(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        self.require(tier, "verifies")
        jobs = self.new_tracker(tier)
        keys = random_keys(4)
        data = fill_slots(ctx.pool, range(4))
        assert jobs.run_store(keys, range(4)).success
        damaged = [keys[0], keys[2]]
        for key in damaged:
            self.call_hook("corrupt", tier, key)
        poison_slots(ctx.pool, range(8, 12))
        result = jobs.run_load(keys, range(8, 12))
        assert result.failed == {k: FailureReason.CORRUPT for k in damaged}, result
        for i in (1, 3):
            assert bytes(ctx.pool.block(8 + i)) == data[i]
        assert self._lookups(tier, damaged) == [LookupResult.MISS] * 2, "kept a bad copy"
        again = jobs.run_load(damaged, [8, 10])
        assert set(again.failed.values()) == {FailureReason.MISSING}, again
        assert tier.stats().errors.get(FailureReason.CORRUPT.value, 0) >= 2
        if measures_store(self, tier):  # what the tier let go of left the store too
            capacity = self.capacity_blocks * self.block_bytes
            check_store_usage(self, tier, capacity, "loads that found damaged copies")

    def test_truncated_copy_fails_load_then_misses(self) -> None:
        """A copy cut short (a torn write, a short read) is never served: the load
        fails `corrupt` for that key, whatever the slot holds, and the copy goes."""
        self.require_hook("truncate")
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        self.require(tier, "verifies")
        jobs = self.new_tracker(tier)
        keys = random_keys(3)
        data = fill_slots(ctx.pool, range(3))
        assert jobs.run_store(keys, range(3)).success
        self.call_optional_hook("truncate", tier, keys[1])
        poison_slots(ctx.pool, range(8, 11))
        result = jobs.run_load(keys, range(8, 11))
        assert result.failed == {keys[1]: FailureReason.CORRUPT}, (
            f"a load of a copy cut short must fail corrupt, alone: {result}")
        for i in (0, 2):
            assert bytes(ctx.pool.block(8 + i)) == data[i]
        assert self._lookups(tier, [keys[1]]) == [LookupResult.MISS], "kept a bad copy"

    # shared

    def test_sibling_sees_blocks_both_ways(self) -> None:
        ctx_a = self.new_context()
        tier_a = self.new_tier(ctx_a)
        self.require(tier_a, "shared")
        ctx_b = self.new_context(ctx_a.namespace)
        tier_b = self.adopt(self.call_hook("sibling", tier_a, ctx_b))
        jobs_a, jobs_b = self.new_tracker(tier_a), self.new_tracker(tier_b)
        from_a, from_b, nowhere = random_keys(2), random_keys(2), random_keys(1)
        data_a = fill_slots(ctx_a.pool, [0, 1])
        data_b = fill_slots(ctx_b.pool, [0, 1])
        assert jobs_a.run_store(from_a, [0, 1]).success
        assert jobs_b.run_store(from_b, [0, 1]).success
        assert self._lookups(tier_b, from_a) == [LookupResult.HIT] * 2
        assert self._lookups(tier_a, from_b) == [LookupResult.HIT] * 2
        assert self._lookups(tier_b, nowhere) == [LookupResult.MISS]
        poison_slots(ctx_b.pool, [4, 5])
        poison_slots(ctx_a.pool, [4, 5])
        assert jobs_b.run_load(from_a, [4, 5]).success
        assert jobs_a.run_load(from_b, [4, 5]).success
        assert [bytes(ctx_b.pool.block(s)) for s in (4, 5)] == data_a
        assert [bytes(ctx_a.pool.block(s)) for s in (4, 5)] == data_b
