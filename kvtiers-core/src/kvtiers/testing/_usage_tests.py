"""Conformance test of usage against what the tier's store really holds.

`stats().usage_bytes` is the tier's own bookkeeping, and the capacity bound is only
as good as that bookkeeping's hold on the storage: a tier that forgets an evicted
block but leaves its bytes behind reports a usage within the bound while its disk
grows without one. The subclass's optional `stored_bytes` hook measures the store
from outside the tier; the test overfills the tier and asserts, after every job,
that the measure settles on the reported usage (plus at most the class's
`stored_overhead_bytes`) and stays within the bound. A tier may delete in the
background: the measure gets `timeout_s` real seconds to settle. Skipped, with the
reason, where the subclass does not implement the hook. The corrupt-copy test
checks the same after the tier drops damaged copies (`check_store_usage`).
"""

from __future__ import annotations

from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.tier import SecondaryTier
from kvtiers.testing._base import TierSuiteBase
from kvtiers.testing._eviction_tests import BOUND
from kvtiers.testing._helpers import check_blocks, fill_slots, poison_slots, random_keys, wait_until


class StoreUsageTests(TierSuiteBase):
    def test_store_holds_what_usage_reports(self) -> None:
        self.require_hook("stored_bytes")
        ctx = self.new_context()
        capacity = 2 * BOUND * self.block_bytes
        tier = self.new_tier(ctx, capacity_bytes=capacity)
        self.call_optional_hook("stored_bytes", tier)  # skips here without the hook
        jobs = self.new_tracker(tier)
        check_store_usage(self, tier, capacity, "opening an empty tier")
        for n, key in enumerate(random_keys(6 * BOUND), 1):
            jobs.store_each([key])
            check_store_usage(self, tier, capacity, f"store {n} of one block")
        assert tier.stats().evictions > 0, "overfilling the tier evicted nothing"

        keys = random_keys(2 * BOUND)  # one job: evictions made in one go
        slots = list(range(len(keys)))
        data = dict(zip(keys, fill_slots(ctx.pool, slots), strict=True))
        result = jobs.run_store(keys, slots)
        assert result.ok, f"a store into a full tier stored nothing: {result.failed}"
        assert set(result.failed.values()) <= {FailureReason.FULL}, result.failed
        check_store_usage(self, tier, capacity, f"a store job of {len(keys)} blocks")
        dst = list(range(32, 32 + len(result.ok)))
        poison_slots(ctx.pool, dst)
        assert jobs.run_load(result.ok, dst).success
        check_blocks(ctx.pool, [(s, data[k]) for k, s in zip(result.ok, dst, strict=True)])

        if tier.persistent:
            tier = self.adopt(self.call_hook("restart", tier, self.new_context(ctx.namespace)))
            check_store_usage(self, tier, capacity, "a restart")


def measures_store(suite: TierSuiteBase, tier: SecondaryTier) -> bool:
    """The suite's class implements `stored_bytes` (for this tier)."""
    try:
        suite.stored_bytes(tier)
    except NotImplementedError:
        return False
    return True


def check_store_usage(
    suite: TierSuiteBase, tier: SecondaryTier, capacity: int, after: str
) -> None:
    """Wait (up to `timeout_s`) until `stored_bytes` is the tier's usage (plus at
    most `stored_overhead_bytes`), then assert that it is within the bound."""
    overhead = suite.stored_overhead_bytes
    seen = {"usage": 0, "held": 0}

    def settled() -> bool:
        seen["usage"] = tier.stats().usage_bytes
        seen["held"] = int(suite.stored_bytes(tier))
        return seen["usage"] <= seen["held"] <= seen["usage"] + overhead

    plus = f" + {overhead} bytes of stated overhead" if overhead else ""
    try:
        wait_until(settled, "", suite.timeout_s)
    except AssertionError:
        usage, held = seen["usage"], seen["held"]
        why = ("bytes the tier no longer counts are still stored: evicted or dropped "
               "blocks not deleted?" if held > usage + overhead else
               "the tier counts bytes its store does not hold")
        raise AssertionError(
            f"after {after}: the store holds {held} bytes (stored_bytes) while the "
            f"tier reports usage {usage}{plus}, for {suite.timeout_s}s: {why}"
        ) from None
    assert seen["held"] <= capacity + overhead, (
        f"after {after}: the store holds {seen['held']} bytes, over the bound of "
        f"{capacity} bytes{plus}")
