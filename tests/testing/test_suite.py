"""The conformance suite checked against itself: every test runs (capabilities
included) on a tier that declares them all, and broken tiers make it fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvtiers import FailureReason, JobResult, SecondaryTier, TierContext, TransferJob
from kvtiers.keys import BlockKey
from kvtiers.testing import (
    JobTracker,
    TierConformance,
    fill_slots,
    make_context,
    random_keys,
    run_job,
)
from kvtiers.tiers import FaultyTier, MemoryTier

from .sticky_tier import StickyMemoryTier, forget_stores, reopen


@pytest.fixture(autouse=True)
def _fresh_stores() -> Iterator[None]:
    yield
    forget_stores()


class TestStickyMemoryTier(TierConformance):
    """Persistent, shared and verifying: no capability test is skipped here."""

    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        return StickyMemoryTier(
            ctx, {"store_id": str(self.tmp_path), "capacity_bytes": capacity_bytes}
        )

    def restart(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        tier.close()
        return reopen(tier, ctx)

    def corrupt(self, tier: SecondaryTier, key: BlockKey) -> None:
        assert isinstance(tier, MemoryTier) and tier.damage(key)

    def sibling(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        return reopen(tier, ctx)


# Broken tiers: the suite must catch each of them.


def run_suite_test(suite: TierConformance, name: str, tmp_path: Path) -> None:
    suite.setup_conformance(tmp_path)
    try:
        getattr(suite, name)()
    finally:
        suite.teardown_conformance()


class _MemorySuite(TierConformance):
    timeout_s = 2.0  # the broken tiers below would otherwise cost the default bound
    options: dict[str, Any] = {}

    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        return MemoryTier(ctx, {"capacity_bytes": capacity_bytes, **self.options})


class _WrongBytes(_MemorySuite):
    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        inner = super().make_tier(ctx, capacity_bytes)
        return FaultyTier.wrap(inner, corrupt_rate=1.0, corrupt_detected=False)


class _Unbounded(_MemorySuite):
    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        return super().make_tier(ctx, 1 << 40)


class _ClaimsVerifiesWithoutHook(_MemorySuite):
    pass  # MemoryTier.verifies is True, but no corrupt() here


class _Silent(MemoryTier):
    """Does the I/O but never reports."""

    def get_finished_jobs(self) -> list[JobResult]:
        super().get_finished_jobs()
        return []


class _Stutters(MemoryTier):
    """Reports every job twice."""

    def get_finished_jobs(self) -> list[JobResult]:
        done = super().get_finished_jobs()
        return done + done


class _ForgetsKeys(MemoryTier):
    """Reports a store's first key neither ok nor failed."""

    def get_finished_jobs(self) -> list[JobResult]:
        done = super().get_finished_jobs()
        for r in done:
            if r.ok:
                r.ok.pop(0)
        return done


def test_suite_catches_wrong_bytes(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="wrong bytes"):
        run_suite_test(_WrongBytes(), "test_store_then_load_round_trip", tmp_path)


def test_suite_catches_a_tier_without_a_bound(tmp_path: Path) -> None:
    with pytest.raises(AssertionError):
        run_suite_test(_Unbounded(), "test_capacity_bound_evicts_oldest", tmp_path)


def test_a_declared_capability_needs_its_hook(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="corrupt"):
        run_suite_test(
            _ClaimsVerifiesWithoutHook(), "test_corrupt_copy_fails_load_then_misses", tmp_path
        )


def test_an_undeclared_capability_is_skipped(tmp_path: Path) -> None:
    with pytest.raises(pytest.skip.Exception, match="not persistent"):
        run_suite_test(_MemorySuite(), "test_persistent_contents_and_usage_survive_restart",
                       tmp_path)


@pytest.mark.parametrize(
    "cls, message", [(_Silent, "did not happen"), (_Stutters, "twice"), (_ForgetsKeys, "omits")]
)
def test_tracker_catches_reporting_bugs(cls: type[MemoryTier], message: str) -> None:
    ctx = make_context(num_slots=4)
    tier = cls(ctx, {"capacity_bytes": 1 << 20})
    try:
        keys = random_keys(2)
        fill_slots(ctx.pool, [0, 1])
        tracker = JobTracker(tier, timeout_s=0.5)
        with pytest.raises(AssertionError, match=message):
            tracker.run_store(keys, [0, 1])
    finally:
        tier.close()


def test_run_job_returns_the_result_of_one_job() -> None:
    ctx = make_context(num_slots=4)
    tier = MemoryTier(ctx, {"capacity_bytes": 1 << 20})
    try:
        keys = random_keys(2)
        fill_slots(ctx.pool, [0, 1])
        result = run_job(tier, TransferJob(10_000_001, keys, [0, 1]), load=False)
        assert result.success and result.bytes_moved == 2 * ctx.block_bytes
        missing = run_job(tier, TransferJob(10_000_002, random_keys(1), [2]), load=True)
        assert set(missing.failed.values()) == {FailureReason.MISSING}
    finally:
        tier.close()
