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

Capability tests run when the tier *instance* sets the flag (`persistent`,
`verifies`, `shared`) and are skipped, with the reason, when it does not; a flag
set without its hook fails. Class settings: `block_bytes`, `num_slots`,
`capacity_blocks`, `timeout_s` (a real-time bound per job and lookup, so a tier that
never reports a job fails instead of hanging). The suite sleeps for nothing: every
context runs on a `ManualClock`, and deadlines are tested by advancing it.

The helpers the suite is built from are public too, for a tier's own tests. For
pytest's detailed assertion messages inside the suite, put
`pytest.register_assert_rewrite("kvtiers.testing")` in your conftest.py. Needs
pytest (kvtiers-core's `test` extra).
"""

from kvtiers.clock import ManualClock
from kvtiers.testing._base import TierSuiteBase
from kvtiers.testing._capability_tests import CapabilityTests
from kvtiers.testing._core_tests import CoreTests
from kvtiers.testing._helpers import (
    DEFAULT_TIMEOUT_S,
    JobTracker,
    check_result,
    expected_pool,
    fill_slots,
    make_context,
    make_namespace,
    poison_slots,
    random_bytes,
    random_keys,
    resolve_lookup,
    run_job,
    snapshot,
    wait_until,
)


class TierConformance(CoreTests, CapabilityTests):
    """Subclass as `class TestMyTier(TierConformance)` and implement make_tier.

    Hooks: `make_tier(ctx, capacity_bytes)` (required), `restart(tier, ctx)`
    (persistent tiers), `corrupt(tier, key)` (verifying tiers), `sibling(tier, ctx)`
    (shared tiers). See `TierSuiteBase` for each hook's contract.
    """


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CapabilityTests",
    "CoreTests",
    "JobTracker",
    "ManualClock",
    "TierConformance",
    "TierSuiteBase",
    "check_result",
    "expected_pool",
    "fill_slots",
    "make_context",
    "make_namespace",
    "poison_slots",
    "random_bytes",
    "random_keys",
    "resolve_lookup",
    "run_job",
    "snapshot",
    "wait_until",
]
