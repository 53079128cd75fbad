"""Conformance tests every tier must pass, whatever its capabilities."""

from __future__ import annotations

import json
import random

from kvtiers.contract.clock import ManualClock
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.keys import MAX_GROUP, make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.stats import TierStats
from kvtiers.testing._base import TierSuiteBase
from kvtiers.testing._helpers import (
    check_blocks,
    expected_pool,
    fill_slots,
    poison_slots,
    random_bytes,
    random_keys,
    resident,
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

    def test_stats_count_each_block_and_answer(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        bb, n = self.block_bytes, 4
        keys, missing = random_keys(n), random_keys(1)[0]
        s0 = tier.stats()
        fill_slots(ctx.pool, range(n))
        assert jobs.run_store(keys, range(n)).success
        s1 = tier.stats()
        assert (s1.blocks_written - s0.blocks_written, s1.bytes_written - s0.bytes_written) == (
            n, n * bb), f"stored {n} blocks of {bb} bytes: {_delta(s0, s1)}"
        assert jobs.run_store(keys, range(n)).bytes_moved == 0
        s2 = tier.stats()
        assert s2.bytes_written == s1.bytes_written, "a store of present keys counted bytes"
        poison_slots(ctx.pool, range(8, 12))
        loaded = jobs.run_load([*keys[:3], missing], range(8, 12))
        assert loaded.failed == {missing: FailureReason.MISSING}, loaded
        s3 = tier.stats()
        assert (s3.blocks_read - s2.blocks_read, s3.bytes_read - s2.bytes_read) == (
            3, 3 * bb), f"loaded 3 blocks of {bb} bytes: {_delta(s2, s3)}"
        assert _errors(s2, s3) == {FailureReason.MISSING.value: 1}, _delta(s2, s3)
        answers = [resolve_lookup(tier, k, self.timeout_s) for k in (*keys[:2], missing)]
        answers.append(resolve_lookup(tier, keys[3], self.timeout_s))
        s4 = tier.stats()
        assert (s4.hits - s3.hits, s4.misses - s3.misses) == (3, 1), (
            f"3 lookups answered HIT and 1 MISS ({answers}): {_delta(s3, s4)}")
        assert s4.evictions == s0.evictions, "evictions counted in a tier that had room"

    def test_keys_differing_only_in_group_are_distinct(self) -> None:
        ctx = self.new_context()
        tier = self.new_tier(ctx)
        jobs = self.new_tracker(tier)
        block_hash = random_bytes(16)
        keys = [make_key(block_hash, g) for g in (0, 1, MAX_GROUP)]
        data = fill_slots(ctx.pool, [0, 1])
        assert jobs.run_store(keys[:2], [0, 1]).success
        assert resolve_lookup(tier, keys[2], self.timeout_s) is LookupResult.MISS, (
            "a key of another KV group answered HIT: the group index was ignored")
        poison_slots(ctx.pool, [4, 5])
        assert jobs.run_load([keys[1], keys[0]], [4, 5]).success
        check_blocks(ctx.pool, [(4, data[1]), (5, data[0])], "keys of two groups mixed up")

    def test_job_past_its_deadline_times_out_without_io(self) -> None:
        ctx = self.new_context()
        clock = ctx.clock
        assert isinstance(clock, ManualClock)
        bound = 4
        tier = self.new_tier(ctx, capacity_bytes=bound * self.block_bytes)
        jobs = self.new_tracker(tier)
        keys = random_keys(bound)
        jobs.store_each(keys)
        held = resident(tier, keys, self.timeout_s)
        assert held, "the tier kept none of the blocks stored"
        errors_before = tier.stats()
        fresh = random_keys(1)[0]
        fill_slots(ctx.pool, [1])
        dst = list(range(8, 8 + len(held)))
        poison_slots(ctx.pool, dst)
        before = snapshot(ctx.pool)
        deadline = clock() + 5.0
        clock.advance(10.0)  # past the deadline before the jobs are even submitted
        late = [jobs.store([fresh], [1], deadline), jobs.load(held, dst, deadline)]
        for job, result in zip(late, jobs.wait(late), strict=True):
            assert result.failed == dict.fromkeys(job.keys, FailureReason.TIMEOUT), (
                f"a job submitted after its deadline did not time out: {result}")
        jobs.settle()
        assert snapshot(ctx.pool) == before, "a job past its deadline touched the pool"
        assert resolve_lookup(tier, fresh, self.timeout_s) is LookupResult.MISS
        assert _errors(errors_before, tier.stats()) == {
            FailureReason.TIMEOUT.value: 1 + len(held)}
        # The timed-out load let go of its blocks: a job needing all their room fits.
        again = random_keys(len(held))
        fill_slots(ctx.pool, range(20, 20 + len(again)))
        result = jobs.run_store(again, range(20, 20 + len(again)))
        assert result.success, f"blocks of a timed-out load stayed pinned: {result.failed}"

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


def _errors(before: TierStats, after: TierStats) -> dict[str, int]:
    """Errors counted between two snapshots, by reason (changes only)."""
    keys = set(before.errors) | set(after.errors)
    out = {k: after.errors.get(k, 0) - before.errors.get(k, 0) for k in keys}
    return {k: v for k, v in out.items() if v}


def _delta(before: TierStats, after: TierStats) -> dict[str, object]:
    """What changed between two snapshots (for failure messages)."""
    a, b = before.as_dict(), after.as_dict()
    out: dict[str, object] = {k: (a[k], b[k]) for k in a if a[k] != b[k] and k != "errors"}
    out["errors"] = _errors(before, after)
    return out
