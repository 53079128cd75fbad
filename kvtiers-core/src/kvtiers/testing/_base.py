"""The hooks a tier's test class implements, and the per-test plumbing behind them."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kvtiers.contract.keys import BlockKey
from kvtiers.contract.namespace import Namespace
from kvtiers.contract.tier import SecondaryTier, TierContext
from kvtiers.testing._gate import GatedPool
from kvtiers.testing._helpers import DEFAULT_TIMEOUT_S, JobTracker, make_context

#: The policy the eviction-order tests ask for when `make_tier` takes one.
ORDER_POLICY = "lru"


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
    #: the tier runs a store while a load is in flight (two or more I/O threads that
    #: take either kind, or asynchronous I/O). Tests that hold a load mid-copy and
    #: need another job to finish meanwhile run only then (else they would wait
    #: for a thread the held load occupies); a serial tier leaves it False.
    concurrent_jobs: ClassVar[bool] = False
    #: the tier reaches slot bytes through `PoolView.block()` on its own threads, so
    #: a `GatedPool` can hold its I/O mid-job. False (a native copy from
    #: `pool.address`) skips the tests that need that.
    gated_pool: ClassVar[bool] = True
    #: what the tier's default eviction policy guarantees: "lru" (the least recently
    #: stored, loaded or touched block goes first: what the suite assumes), or None
    #: (unknown: eviction-order tests check only what every bounded policy does).
    #: Not consulted when `make_tier` takes an `eviction_policy` keyword: the
    #: order tests then pass `eviction_policy="lru"` and the other tests pass none.
    eviction_order: ClassVar[str | None] = "lru"
    #: bytes the `stored_bytes` measure may hold beyond the tier's usage (and so
    #: beyond the bound), fixed whatever the tier stores: a manifest or header the
    #: hook cannot leave out. 0: the measure must equal usage.
    stored_overhead_bytes: ClassVar[int] = 0

    tmp_path: Path

    # The hooks. Only make_tier is required; the others unlock capability tests.

    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        """A new tier over `ctx`, bounded by `capacity_bytes`. Every call within one
        test must address the same storage (e.g. under `self.tmp_path`), so that the
        namespace test opens a second tier where the first one stored.

        A tier whose eviction policy is configurable may take a keyword
        `eviction_policy: str` (a registered policy name, with a default of its
        own): the eviction-order tests then ask for "lru" and assert LRU order,
        whatever policy the other tests run under."""
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

    def truncate(self, tier: SecondaryTier, key: BlockKey) -> None:
        """Verifying tiers, optional (its test is skipped without it): cut the stored
        copy of `key` short, behind the tier's back, as a torn write or a short
        read would leave it (keep the first half of the block's bytes)."""
        raise NotImplementedError

    def stored_bytes(self, tier: SecondaryTier) -> int:
        """Optional, any tier (its test is skipped without it): what the tier's
        backing store holds for `tier`'s namespace, measured from outside the tier
        (its files under the root, a raw listing of its prefix, its rows, its keys),
        in the units the tier counts against `capacity_bytes` (whole files or objects
        where it counts those, the block bytes of each value where it counts those).
        Never ask the tier itself: the point is to catch usage that forgets bytes
        still stored, such as evicted blocks whose files were never deleted."""
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
        self._trackers: list[JobTracker] = []
        self._gated: list[GatedPool] = []

    def teardown_conformance(self) -> None:
        """Open every gate, close every tier the test built (newest first; `close`
        must not raise), then poll each tracker once more: a job reported again
        after the test saw its result, at close or later, fails the test here."""
        gated, self._gated = self._gated, []
        for pool in gated:
            pool.release_all()
        opened, self._opened = self._opened, []
        for tier in reversed(opened):
            tier.close()
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.poll(others=True)

    def adopt(self, tier: SecondaryTier) -> SecondaryTier:
        """Close `tier` at the end of the test."""
        self._opened.append(tier)
        return tier

    def new_context(self, namespace: Namespace | None = None) -> TierContext:
        """A context over a fresh pool of `num_slots` slots, with a `ManualClock`."""
        return make_context(self.block_bytes, self.num_slots, namespace=namespace)

    def new_gated_context(
        self, namespace: Namespace | None = None
    ) -> tuple[TierContext, GatedPool]:
        """`new_context` over a `GatedPool` (its gates are opened at the end of the
        test); skips the test when the class sets `gated_pool = False`."""
        if not self.gated_pool:
            pytest.skip(f"{type(self).__name__} sets gated_pool = False")
        pool = GatedPool(self.num_slots, self.block_bytes, hold_s=self.timeout_s)
        self._gated.append(pool)
        ctx = make_context(self.block_bytes, self.num_slots, namespace=namespace, pool=pool)
        return ctx, pool

    def new_tier(
        self,
        ctx: TierContext | None = None,
        capacity_bytes: int | None = None,
        *,
        lru: bool = False,
    ) -> SecondaryTier:
        """`make_tier`, closed at the end of the test. With `lru`, ask for the LRU
        policy when `make_tier` takes an `eviction_policy` keyword."""
        if ctx is None:
            ctx = self.new_context()
        if capacity_bytes is None:
            capacity_bytes = self.capacity_blocks * self.block_bytes
        if lru and self.takes_policy():
            make: Any = self.make_tier
            tier = make(ctx, capacity_bytes, eviction_policy=ORDER_POLICY)
        else:
            tier = self.make_tier(ctx, capacity_bytes)
        assert isinstance(tier, SecondaryTier), f"make_tier returned {tier!r}"
        return self.adopt(tier)

    def takes_policy(self) -> bool:
        """`make_tier` takes an `eviction_policy` keyword."""
        params = inspect.signature(self.make_tier).parameters.values()
        return any(
            (p.name == "eviction_policy" and p.kind is not p.POSITIONAL_ONLY)
            or p.kind is p.VAR_KEYWORD
            for p in params
        )

    def order_known(self) -> bool:
        """Tiers built with `new_tier(lru=True)` evict least recently used first."""
        return self.takes_policy() or self.eviction_order == ORDER_POLICY

    def require_order(self) -> None:
        """Skip the test unless the eviction order of `new_tier(lru=True)` is known."""
        if not self.order_known():
            pytest.skip(
                f"{type(self).__name__}: eviction_order is {self.eviction_order!r} and "
                "make_tier takes no eviction_policy: the eviction order is unknown"
            )

    def require_concurrency(self) -> None:
        """Skip the test unless the class sets `concurrent_jobs`."""
        if not self.concurrent_jobs:
            pytest.skip(
                f"{type(self).__name__} does not set concurrent_jobs = True (a store "
                "finishing while a load is held needs a second I/O thread)"
            )

    def new_tracker(self, tier: SecondaryTier) -> JobTracker:
        """A `JobTracker` for `tier`, polled once more at the end of the test."""
        tracker = JobTracker(tier, self.timeout_s)
        self._trackers.append(tracker)
        return tracker

    def require(self, tier: SecondaryTier, flag: str) -> None:
        """Skip the test unless the tier instance sets capability `flag`."""
        if not getattr(tier, flag):
            pytest.skip(f"{type(tier).__name__} is not {flag}")

    def require_hook(self, hook: str) -> None:
        """Skip the test now, before a tier is built, when the class does not
        override the optional hook `hook` (`truncate`, `stored_bytes`)."""
        if getattr(type(self), hook) is getattr(TierSuiteBase, hook):
            pytest.skip(f"{type(self).__name__} does not implement {hook}()")

    def call_optional_hook(self, hook: str, tier: SecondaryTier, *args: Any) -> Any:
        """Call a hook no capability promises (`truncate`); skip if not implemented."""
        try:
            return getattr(self, hook)(tier, *args)
        except NotImplementedError:
            pytest.skip(f"{type(self).__name__} does not implement {hook}()")

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
