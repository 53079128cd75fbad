"""The hooks a tier's test class implements, and the per-test plumbing behind them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kvtiers.keys import BlockKey
from kvtiers.namespace import Namespace
from kvtiers.testing._helpers import DEFAULT_TIMEOUT_S, JobTracker, make_context
from kvtiers.tier import SecondaryTier, TierContext


class TierSuiteBase:
    """Hooks, settings and per-test state shared by the conformance tests.

    Each test gets `self.tmp_path` (a fresh directory); every tier the suite builds
    during the test is closed at its end.
    """

    #: bytes of one block (the pool's slots are this, rounded up to 4 KiB)
    block_bytes: ClassVar[int] = 16384
    #: slots in each pool the suite makes (tests use up to 50)
    num_slots: ClassVar[int] = 64
    #: capacity, in blocks, of tiers built by tests that are not about capacity
    capacity_blocks: ClassVar[int] = 256
    #: real seconds a job or lookup may take before the tier is called stuck
    timeout_s: ClassVar[float] = DEFAULT_TIMEOUT_S

    tmp_path: Path

    # The hooks. Only make_tier is required; the others unlock capability tests.

    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        """A new tier over `ctx`, bounded by `capacity_bytes`. Every call within one
        test must address the same storage (e.g. under `self.tmp_path`), so that the
        namespace test opens a second tier where the first one stored."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_tier")

    def restart(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        """Persistent tiers: close `tier` and open it again over the same storage, with
        `ctx` (a new pool, the same namespace), as a restarted process would."""
        raise NotImplementedError

    def corrupt(self, tier: SecondaryTier, key: BlockKey) -> None:
        """Verifying tiers: damage the stored copy of `key` behind the tier's back
        (flip a byte of the data as stored), without telling the tier."""
        raise NotImplementedError

    def sibling(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        """Shared tiers: a second instance on the same store, as another process would
        open it, with `ctx` (its own pool, the same namespace)."""
        raise NotImplementedError

    # Per-test plumbing.

    @pytest.fixture(autouse=True)
    def _kvtiers_conformance(self, tmp_path: Path) -> Iterator[None]:
        self.setup_conformance(tmp_path)
        yield
        self.teardown_conformance()

    def setup_conformance(self, tmp_path: Path) -> None:
        """Per-test state (called by an autouse fixture; call it yourself to run a
        suite test outside pytest's collection)."""
        self.tmp_path = tmp_path
        self._opened: list[SecondaryTier] = []

    def teardown_conformance(self) -> None:
        """Close every tier the test built, newest first. `close` must not raise."""
        opened, self._opened = self._opened, []
        for tier in reversed(opened):
            tier.close()

    def adopt(self, tier: SecondaryTier) -> SecondaryTier:
        """Close `tier` at the end of the test."""
        self._opened.append(tier)
        return tier

    def new_context(self, namespace: Namespace | None = None) -> TierContext:
        """A context over a fresh pool of `num_slots` slots, with a `ManualClock`."""
        return make_context(self.block_bytes, self.num_slots, namespace=namespace)

    def new_tier(
        self, ctx: TierContext | None = None, capacity_bytes: int | None = None
    ) -> SecondaryTier:
        """`make_tier`, closed at the end of the test."""
        if ctx is None:
            ctx = self.new_context()
        if capacity_bytes is None:
            capacity_bytes = self.capacity_blocks * self.block_bytes
        tier = self.make_tier(ctx, capacity_bytes)
        assert isinstance(tier, SecondaryTier), f"make_tier returned {tier!r}"
        return self.adopt(tier)

    def new_tracker(self, tier: SecondaryTier) -> JobTracker:
        return JobTracker(tier, self.timeout_s)

    def require(self, tier: SecondaryTier, flag: str) -> None:
        """Skip the test unless the tier instance sets capability `flag`."""
        if not getattr(tier, flag):
            pytest.skip(f"{type(tier).__name__} is not {flag}")

    def call_hook(self, hook: str, tier: SecondaryTier, *args: Any) -> Any:
        """Call `restart`/`corrupt`/`sibling`; a capability flag without its hook is a
        failure, not a skip: the flag promises what the hook's tests check."""
        try:
            return getattr(self, hook)(tier, *args)
        except NotImplementedError:
            pytest.fail(
                f"{type(tier).__name__} declares a capability whose tests need "
                f"{type(self).__name__}.{hook}(); implement it"
            )
