"""The master killed (-9) mid-run and started again on the same ports, or frozen
(SIGSTOP) and thawed: jobs and lookups become failures and misses (never a hang,
never an exception), the tier's breaker opens; once the master is back, stores and
loads work again, and the blocks a restarted master forgot leave the index, so
usage is true again."""

from __future__ import annotations

from kvtiers import FailureReason, LookupResult
from kvtiers.contract.clock import monotonic
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    poison_slots,
    random_keys,
    resolve_lookup,
    wait_until,
)

from tests.mooncake.helpers import Tiers, context
from tests.mooncake.master import Master

FAILED = {FailureReason.IO, FailureReason.TIMEOUT, FailureReason.MISSING}


def test_master_killed_and_restarted(master: Master, tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=32, retry_s=0.3)
    bb = ctx.block_bytes
    jobs = JobTracker(tier, 60)
    before = random_keys(8)
    data: dict[bytes, bytes] = {}
    for key, block in zip(before, fill_slots(ctx.pool, range(8)), strict=True):
        data[key] = block
    assert jobs.run_store(before, range(8)).success
    assert tier.stats().usage_bytes == 8 * bb

    master.kill()
    poison_slots(ctx.pool, range(16, 24))
    for _ in range(2):  # the first finds the master gone; the second, the breaker open
        result = jobs.run_load(before, range(16, 24), deadline=monotonic() + 10)
        assert not result.ok and set(result.failed.values()) <= FAILED, result.failed
    assert tier.breaker.opened >= 1
    stranger = random_keys(1)[0]
    assert resolve_lookup(tier, stranger, 30) is LookupResult.MISS  # the probe fails: a miss
    later = random_keys(4)
    for key, block in zip(later, fill_slots(ctx.pool, range(8, 12)), strict=True):
        data[key] = block
    result = jobs.run_store(later, range(8, 12), deadline=monotonic() + 10)
    assert not result.ok and set(result.failed.values()) <= FAILED | {FailureReason.FULL}

    master.start()  # empty: a master keeps nothing across a restart

    def stored_again() -> bool:
        return jobs.run_store(later, range(8, 12)).success

    wait_until(stored_again, "a store once the master is back", 60)
    assert tier.breaker.recovered >= 1
    # The reconciliation drops what the new master does not hold.
    wait_until(lambda: tier.stats().usage_bytes == 4 * bb, "usage back to the truth", 30)
    assert set(tiers.stored(tier)) == set(later)
    poison_slots(ctx.pool, range(16, 20))
    assert jobs.run_load(later, range(16, 20)).success
    check_blocks(ctx.pool, [(16 + i, data[k]) for i, k in enumerate(later)])
    result = jobs.run_load(before[:2], [20, 21])
    assert set(result.failed.values()) == {FailureReason.MISSING}, result
    assert resolve_lookup(tier, before[0], 30) is LookupResult.MISS



def test_master_frozen_and_thawed(master: Master, tiers: Tiers) -> None:
    """SIGSTOP: the master's sockets stay open and nothing answers (a hung or
    partitioned master, which a kill does not show). Every job and lookup ends while
    it is still frozen - Mooncake's RPC time-out is the tier's `timeout_s` - as a
    failure or a miss, the breaker opens and later calls fail at once; SIGCONT: the
    same blocks load again, bytes intact, and new stores work."""
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=32, retry_s=0.3, timeout_s=1.0)
    jobs = JobTracker(tier, 30)  # far beyond the deadlines: only a hang reaches it
    keys = random_keys(8)
    data = dict(zip(keys, fill_slots(ctx.pool, range(8)), strict=True))
    assert jobs.run_store(keys, range(8)).success

    master.freeze()
    try:
        poison_slots(ctx.pool, range(16, 24))
        for _ in range(2):  # the first waits out the RPC time-out; the second, the breaker
            result = jobs.run_load(keys, range(16, 24), deadline=monotonic() + 2)
            assert not result.ok and set(result.failed.values()) <= FAILED, result.failed
        assert tier.breaker.opened >= 1
        assert resolve_lookup(tier, random_keys(1)[0], 30) is LookupResult.MISS
        later = random_keys(2)
        for key, block in zip(later, fill_slots(ctx.pool, range(8, 10)), strict=True):
            data[key] = block
        result = jobs.run_store(later, range(8, 10), deadline=monotonic() + 2)
        assert not result.ok and set(result.failed.values()) <= FAILED | {FailureReason.FULL}
        assert master.proc is not None and master.proc.poll() is None  # frozen, not dead
    finally:
        master.thaw()

    # The thawed master kept everything: the blocks load again, intact.
    wait_until(lambda: jobs.run_load(keys, range(16, 24)).success, "loads after SIGCONT", 30)
    check_blocks(ctx.pool, [(16 + i, data[k]) for i, k in enumerate(keys)])
    assert tier.breaker.recovered >= 1
    assert jobs.run_store(later, range(8, 10)).success
    poison_slots(ctx.pool, range(24, 26))
    assert jobs.run_load(later, range(24, 26)).success
    check_blocks(ctx.pool, [(24 + i, data[k]) for i, k in enumerate(later)])
    assert tier.stats().usage_bytes == 10 * ctx.block_bytes
