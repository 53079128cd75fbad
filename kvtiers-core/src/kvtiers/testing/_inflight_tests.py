"""Conformance tests that hold a tier's I/O in the middle of a job (`GatedPool`).

They look at the tier while one of its threads waits at a gate inside
`PoolView.block()`: a store has started copying but its bytes are not in yet, or
a load has not written its slot yet. Nothing sleeps: each test waits for the
tier to reach the gate, looks, then opens it. Each test holds one job at a time
unless the class sets `concurrent_jobs`, so a tier with a single I/O thread is
never asked to run a second job while the first is held.
"""

from __future__ import annotations

from kvtiers.contract.clock import ManualClock
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing._base import TierSuiteBase
from kvtiers.testing._eviction_tests import BOUND
from kvtiers.testing._helpers import (
    check_blocks,
    fill_slots,
    poison_slots,
    random_keys,
    resident,
    resolve_lookup,
)


class InFlightTests(TierSuiteBase):
    def test_store_is_no_hit_before_its_bytes_are_in(self) -> None:
        ctx, pool = self.new_gated_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        keys = random_keys(3)
        data = fill_slots(pool, range(3))
        gate = pool.gate(range(3))
        store = jobs.store(keys, range(3))
        gate.wait_entered(self.timeout_s, "a store")
        # The store is copying: none of its blocks may be a HIT yet, since a load
        # submitted now would not find their bytes.
        for key in keys:
            answer = resolve_lookup(tier, key, self.timeout_s)
            assert answer is LookupResult.MISS, (
                f"lookup answered {answer.name} for a block whose store is still copying")
        poison_slots(pool, range(8, 11))
        load = jobs.load(keys, range(8, 11))  # during the store: the bytes, or a miss
        assert not gate.expired
        gate.release()
        stored, loaded = jobs.wait([store, load])
        assert stored.success, stored.failed
        assert set(loaded.failed.values()) <= {FailureReason.MISSING}, loaded.failed
        check_blocks(pool, [(8 + i, data[i]) for i, k in enumerate(keys) if k in loaded.ok],
                     "a load that ran during the store")
        assert resident(tier, keys, self.timeout_s) == keys
        poison_slots(pool, range(12, 15))
        assert jobs.run_load(keys, range(12, 15)).success
        check_blocks(pool, [(12 + i, data[i]) for i in range(3)])

    def test_load_submitted_during_a_store_keeps_its_blocks(self) -> None:
        """What lookup called a HIT stays until the load ends: a store already
        running when the load is submitted must not evict the load's blocks."""
        ctx, pool = self.new_gated_context()
        tier = self.new_tier(ctx, capacity_bytes=BOUND * self.block_bytes)
        jobs = self.new_tracker(tier)
        keys = random_keys(BOUND + 2)
        data = jobs.store_each(keys)  # full
        fill_slots(pool, [1])
        gate = pool.gate([1])
        running = jobs.store(random_keys(1), [1])  # needs room
        gate.wait_entered(self.timeout_s, "a store")
        held = resident(tier, keys, self.timeout_s)
        assert held, "a full tier holds nothing while a store runs"
        dst = list(range(10, 10 + len(held)))
        poison_slots(pool, dst)
        load = jobs.load(held, dst)
        fill_slots(pool, range(20, 20 + BOUND))
        later = jobs.store(random_keys(BOUND), range(20, 20 + BOUND))  # needs every block
        assert not gate.expired
        gate.release()
        loaded = jobs.wait([running, load, later])[1]
        assert loaded.success, (
            f"blocks that were HITs when the load was submitted were evicted before "
            f"it read them (not pinned at submit_load): {loaded.failed}")
        check_blocks(pool, [(s, data[k]) for k, s in zip(held, dst, strict=True)])
        jobs.settle()

    def test_block_being_loaded_is_not_evicted(self) -> None:
        self.require_concurrency()
        ctx, pool = self.new_gated_context()
        tier = self.new_tier(ctx, capacity_bytes=BOUND * self.block_bytes)
        jobs = self.new_tracker(tier)
        keys = random_keys(BOUND + 2)
        data = jobs.store_each(keys)
        held = resident(tier, keys, self.timeout_s)
        assert held, "a full tier holds nothing"
        dst = list(range(10, 10 + len(held)))
        poison_slots(pool, dst)
        gate = pool.gate(dst)
        load = jobs.load(held, dst)
        gate.wait_entered(self.timeout_s, "a load")
        # Every block the tier holds is being loaded: a store that needs room must
        # fail `full` (or use room the tier had), never evict one of them.
        fresh = random_keys(BOUND)
        fill_slots(pool, range(20, 20 + BOUND))
        stored = jobs.wait([jobs.store(fresh, range(20, 20 + BOUND))])[0]
        assert set(stored.failed.values()) <= {FailureReason.FULL}, stored.failed
        assert resident(tier, held, self.timeout_s) == held, (
            "a store evicted a block while a load of it was in flight")
        assert not gate.expired
        gate.release()
        loaded = jobs.wait([load])[0]
        assert loaded.success, f"a block was evicted while being loaded: {loaded.failed}"
        check_blocks(pool, [(s, data[k]) for k, s in zip(held, dst, strict=True)])
        assert resident(tier, stored.ok, self.timeout_s) == stored.ok

    def test_no_result_while_the_jobs_io_runs(self) -> None:
        """A job is reported only once no I/O of the tier can touch its slots, even
        when its deadline passes meanwhile."""
        ctx, pool = self.new_gated_context()
        clock = ctx.clock
        assert isinstance(clock, ManualClock), "the tier must run on its context's clock"
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        keys = random_keys(2)
        data = fill_slots(pool, [0, 1])
        for load, slots in ((False, [0, 1]), (True, [8, 9])):
            what = "a load" if load else "a store"
            if load:
                # The held store may have timed out part way: store what is missing.
                assert jobs.run_store(keys, [0, 1]).success
                poison_slots(pool, slots)
            gate = pool.gate(slots)
            job = (jobs.load if load else jobs.store)(keys, slots, clock() + 5.0)
            gate.wait_entered(self.timeout_s, what)
            clock.advance(10.0)
            jobs.poll()
            assert job.job_id not in jobs.results, (
                f"{what} was reported while a tier thread was still inside its slots")
            assert not gate.expired
            gate.release()
            result = jobs.wait([job])[0]
            assert set(result.failed.values()) <= {FailureReason.TIMEOUT}, result.failed
            if load:
                check_blocks(pool, [(8 + i, data[i]) for i, k in enumerate(keys)
                                    if k in result.ok])
        jobs.settle()

    def test_scheduler_calls_do_not_wait_for_io(self) -> None:
        """lookup, submit_*, touch, get_finished_jobs and stats return while the
        tier's I/O is held (they must never wait for it)."""
        ctx, pool = self.new_gated_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        stored, fresh, other = random_keys(2), random_keys(2), random_keys(2)
        data = fill_slots(pool, range(6))
        assert jobs.run_store(stored, [0, 1]).success
        gates = [pool.gate([2, 3])]
        held = [jobs.store(fresh, [2, 3])]
        gates[0].wait_entered(self.timeout_s, "a store")

        def returned(call: str) -> None:
            # A call that waited for the I/O returned only when a gate expired.
            expired = [sorted(g.slots) for g in gates if g.expired]
            assert not expired, (
                f"{call} waited for the tier's I/O (held at slots {expired}): "
                "scheduler-thread calls must never block on I/O")

        if self.concurrent_jobs:
            gates.append(pool.gate([8, 9]))
            held.append(jobs.load(stored, [8, 9]))
            returned("submit_load")
            gates[1].wait_entered(self.timeout_s, "a load")
        for key in stored:
            assert tier.lookup(key) in (LookupResult.HIT, LookupResult.RETRY)
        assert tier.lookup(other[0]) in (LookupResult.MISS, LookupResult.RETRY)
        returned("lookup")
        tier.touch(stored)
        returned("touch")
        tier.stats()
        returned("stats")
        jobs.poll()
        returned("get_finished_jobs")
        queued = [jobs.store(other, [4, 5]), jobs.load(stored, [10, 11])]
        returned("submit_store or submit_load")
        for gate in gates:
            gate.release()
        for result in jobs.wait(held + queued):
            assert result.success, result.failed
        check_blocks(pool, [(10, data[0]), (11, data[1])])
        jobs.settle()

    def test_a_slot_the_tier_cannot_reach_fails_its_key_only(self) -> None:
        ctx, pool = self.new_gated_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        keys = random_keys(3)
        data = fill_slots(pool, range(3))
        pool.fail([1])
        stored = jobs.run_store(keys, range(3))
        assert stored.failed.get(keys[1]) is FailureReason.IO, (
            f"a store whose slot raised did not fail that key with io: {stored}")
        assert set(stored.failed.values()) == {FailureReason.IO}
        pool.mend()
        assert resolve_lookup(tier, keys[1], self.timeout_s) is LookupResult.MISS, (
            "a block whose store failed answers HIT")
        good = [k for k in keys if k in stored.ok]
        poison_slots(pool, range(8, 8 + len(good)))
        assert jobs.run_load(good, range(8, 8 + len(good))).success
        check_blocks(pool, [(8 + i, data[keys.index(k)]) for i, k in enumerate(good)])
        # A load whose slot cannot be reached fails that key, never claims it.
        assert jobs.run_store([keys[1]], [1]).success
        pool.fail([12])
        loaded = jobs.run_load(keys, [11, 12, 13])
        assert loaded.failed.get(keys[1]) is FailureReason.IO, (
            f"a load into a slot that raised did not fail that key with io: {loaded}")
        assert set(loaded.failed.values()) == {FailureReason.IO}
        pool.mend()
        check_blocks(pool, [(11 + keys.index(k), data[keys.index(k)]) for k in loaded.ok])
        jobs.settle()
