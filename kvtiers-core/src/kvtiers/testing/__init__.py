"""`kvtiers.testing`: the conformance suite every secondary tier must pass.

Subclass `TierConformance` in a test module, implement `make_tier`, and pytest
collects the whole suite for your tier::

    from kvtiers.testing import TierConformance

    class TestMyTier(TierConformance):
        def make_tier(self, ctx, capacity_bytes):
            return MyTier(ctx, {"root": str(self.tmp_path), "capacity_bytes": capacity_bytes})

        # only if MyTier.persistent: close it and open it again on the same storage
        def restart(self, tier, ctx):
            tier.close()
            return self.make_tier(ctx, tier.config["capacity_bytes"])

        # only if MyTier.verifies: damage the stored bytes behind the tier's back
        def corrupt(self, tier, key): ...

        # only if MyTier.shared: a second instance on the same store
        def sibling(self, tier, ctx): ...

        # optional, verifying tiers: cut the stored copy short (else skipped)
        def truncate(self, tier, key): ...

        # optional, any tier: what the backing store holds, measured from outside
        # the tier, in the units it counts against capacity (else skipped)
        def stored_bytes(self, tier):
            return sum(p.stat().st_size for p in (self.tmp_path / "blocks").iterdir())

Capability tests run when the tier *instance* sets the flag (`persistent`,
`verifies`, `shared`) and are skipped, with the reason, when it does not; a flag
set without its hook fails. Class settings: `block_bytes`, `num_slots`,
`capacity_blocks`, `timeout_s` (a real-time bound per job and lookup, so a tier that
never reports a job fails instead of hanging), `concurrent_jobs` (set True when the
tier runs a store while a load is in flight: unlocks the test that holds a load
while another job must finish), `gated_pool` (False if the tier reaches slot bytes
other than through `PoolView.block()`), `eviction_order` ("lru" by default: None
when the tier's default policy is not LRU), `stored_overhead_bytes` (0: how much
more than usage, and than the bound, `stored_bytes` may measure). A `make_tier`
that takes an `eviction_policy` keyword gets "lru" from the eviction-order tests.

The suite sleeps for nothing: every context runs on a `ManualClock`, deadlines are
tested by advancing it, and a `GatedPool` holds a tier's I/O mid-job (a thread
inside `PoolView.block()` waits at a gate the test opens) so a test can look at
the tier while a store copies or a load has not written its slot yet.

The helpers the suite is built from are public too, for a tier's own tests. For
pytest's detailed assertion messages inside the suite, put
`pytest.register_assert_rewrite("kvtiers.testing")` in your conftest.py. Needs
pytest (kvtiers-core's `test` extra).
"""

from kvtiers.contract.clock import ManualClock
from kvtiers.testing._base import TierSuiteBase
from kvtiers.testing._capability_tests import CapabilityTests
from kvtiers.testing._core_tests import CoreTests
from kvtiers.testing._eviction_tests import EvictionTests
from kvtiers.testing._gate import DEFAULT_HOLD_S, Gate, GatedPool
from kvtiers.testing._helpers import (
    DEFAULT_TIMEOUT_S,
    JobTracker,
    check_blocks,
    check_result,
    expected_pool,
    fill_slots,
    make_context,
    make_namespace,
    poison_slots,
    random_bytes,
    random_keys,
    resident,
    resolve_lookup,
    run_job,
    snapshot,
    wait_until,
)
from kvtiers.testing._inflight_tests import InFlightTests
from kvtiers.testing._usage_tests import StoreUsageTests


class TierConformance(
    CoreTests, EvictionTests, StoreUsageTests, InFlightTests, CapabilityTests
):
    """Subclass as `class TestMyTier(TierConformance)` and implement make_tier.

    Hooks: `make_tier(ctx, capacity_bytes[, eviction_policy])` (required),
    `restart(tier, ctx)` (persistent tiers), `corrupt(tier, key)` (verifying
    tiers), `sibling(tier, ctx)` (shared tiers), `truncate(tier, key)` and
    `stored_bytes(tier)` (optional).
    See `TierSuiteBase` for each hook's contract and the class settings.
    """


__all__ = [
    "DEFAULT_HOLD_S",
    "DEFAULT_TIMEOUT_S",
    "CapabilityTests",
    "CoreTests",
    "EvictionTests",
    "Gate",
    "GatedPool",
    "InFlightTests",
    "JobTracker",
    "ManualClock",
    "StoreUsageTests",
    "TierConformance",
    "TierSuiteBase",
    "check_blocks",
    "check_result",
    "expected_pool",
    "fill_slots",
    "make_context",
    "make_namespace",
    "poison_slots",
    "random_bytes",
    "random_keys",
    "resident",
    "resolve_lookup",
    "run_job",
    "snapshot",
    "wait_until",
]
