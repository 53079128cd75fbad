"""The conformance suite checked against itself: every test runs (capabilities
included) on tiers that declare them all, and broken tiers make it fail: each
test of the kit is shown to fail on the bug it is about (`ToyTier`'s switches),
while the tier without the bug passes the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kvtiers import FailureReason, JobResult, SecondaryTier, TierContext, TransferJob
from kvtiers.contract.keys import BlockKey
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
from .toy_tier import BUGS, ToyTier


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


class TestToyTier(TierConformance):
    """Two I/O threads, loads first; takes `eviction_policy` (the order tests ask
    for "lru"); runs the other tests under ARC."""

    concurrent_jobs = True
    options: ClassVar[dict[str, Any]] = {}

    def make_tier(
        self, ctx: TierContext, capacity_bytes: int, eviction_policy: str = "arc"
    ) -> SecondaryTier:
        return ToyTier(ctx, {"capacity_bytes": capacity_bytes,
                             "eviction_policy": eviction_policy, **self.options})

    def corrupt(self, tier: SecondaryTier, key: BlockKey) -> None:
        assert isinstance(tier, ToyTier)
        tier.damage(key)

    def truncate(self, tier: SecondaryTier, key: BlockKey) -> None:
        assert isinstance(tier, ToyTier)
        tier.cut(key)


class TestToyTierOnDisk(TestToyTier):
    """Persistent: block files and a recency file under tmp_path, which
    `stored_bytes` measures from outside the tier."""

    def make_tier(
        self, ctx: TierContext, capacity_bytes: int, eviction_policy: str = "arc"
    ) -> SecondaryTier:
        return ToyTier(ctx, {"capacity_bytes": capacity_bytes, "root_dir": str(self.root),
                             "eviction_policy": eviction_policy, **self.options})

    @property
    def root(self) -> Path:
        return self.tmp_path / "toy"

    def restart(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        tier.close()
        return ToyTier(ctx, tier.config)

    def stored_bytes(self, tier: SecondaryTier) -> int:
        blocks = self.root / tier.ctx.namespace.fingerprint / "blocks"
        return sum(path.stat().st_size for path in blocks.iterdir())


class TestToyTierSerialStoresFirst(TestToyTier):
    """One I/O thread that takes stores before loads: a load waits behind stores."""

    concurrent_jobs = False
    options: ClassVar[dict[str, Any]] = {"threads": 1, "loads_first": False}


class TestToyTierUnderSieve(TestToyTier):
    """A policy the suite cannot choose (make_tier takes none) and says is not LRU:
    the order tests are skipped, every other test holds."""

    eviction_order = None

    def make_tier(  # type: ignore[override]
        self, ctx: TierContext, capacity_bytes: int
    ) -> SecondaryTier:
        return super().make_tier(ctx, capacity_bytes, eviction_policy="sieve")


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


# Each bug of ToyTier, and the test of the kit that catches it.


class _Toy(TestToyTier):
    timeout_s = 1.0  # a held gate or a lost result costs this, not the default bound


class _DiskToy(TestToyTierOnDisk):
    timeout_s = 1.0


def _toy(bugs: set[str], *, on_disk: bool = False, **options: Any) -> TestToyTier:
    class Suite(_DiskToy if on_disk else _Toy):  # type: ignore[misc]
        pass

    Suite.options = {"bugs": sorted(bugs), **options}
    Suite.concurrent_jobs = options.get("threads", 2) > 1
    return Suite()


CAUGHT = [
    # (bug, tier options, the test that catches it, what its message says)
    ("no_pin", {"threads": 1, "loads_first": False},
     "test_load_submitted_during_a_store_keeps_its_blocks", "not pinned at submit_load"),
    ("no_pin", {}, "test_block_being_loaded_is_not_evicted", "in flight"),
    ("hit_early", {}, "test_store_is_no_hit_before_its_bytes_are_in", "still copying"),
    ("evict_own", {}, "test_store_job_never_evicts_its_own_new_blocks", "own"),
    ("evict_own", {}, "test_store_job_never_evicts_its_present_blocks", "already present"),
    ("no_touch", {}, "test_touch_refreshes_recency", "touch is ignored"),
    ("load_no_refresh", {}, "test_load_refreshes_recency", "refresh recency"),
    ("report_early", {}, "test_no_result_while_the_jobs_io_runs", "still inside"),
    ("report_again", {}, "test_store_then_load_round_trip", "reported twice"),
    ("report_again", {}, "test_close_is_idempotent_and_later_jobs_fail_closed",
     "reported twice"),
    ("blocking_lookup", {}, "test_scheduler_calls_do_not_wait_for_io", "waited"),
    ("half_ok", {}, "test_truncated_copy_fails_load_then_misses", "cut short"),
    ("no_write_stats", {}, "test_stats_count_each_block_and_answer", "stored 4 blocks"),
    ("no_eviction_count", {}, "test_capacity_bound_evicts_oldest", "evictions counted"),
    ("no_deadline", {}, "test_job_past_its_deadline_times_out_without_io",
     "did not time out"),
    ("slot_error_ok", {}, "test_a_slot_the_tier_cannot_reach_fails_its_key_only",
     "did not fail that key"),
    ("ignore_group", {}, "test_keys_differing_only_in_group_are_distinct", "group"),
    ("keep_evicted", {"on_disk": True}, "test_store_holds_what_usage_reports",
     "blocks not deleted"),
    ("keep_damaged", {"on_disk": True}, "test_corrupt_copy_fails_load_then_misses",
     "blocks not deleted"),
    ("forget_recency", {"on_disk": True}, "test_persistent_uses_survive_restart",
     "recency of uses was lost"),
]


def test_every_bug_is_caught_by_some_test() -> None:
    assert {bug for bug, *_ in CAUGHT} == set(BUGS)


@pytest.mark.parametrize(
    "bug, options, name, message", CAUGHT, ids=[f"{c[0]}-{c[2][5:]}" for c in CAUGHT]
)
def test_suite_catches_each_bug(
    bug: str, options: dict[str, Any], name: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(AssertionError, match=message):
        run_suite_test(_toy({bug}, **options), name, tmp_path)


@pytest.mark.parametrize("bug, options, name, message", CAUGHT,
                         ids=[f"{c[0]}-{c[2][5:]}" for c in CAUGHT])
def test_the_same_tier_without_the_bug_passes(
    bug: str, options: dict[str, Any], name: str, message: str, tmp_path: Path
) -> None:
    run_suite_test(_toy(set(), **options), name, tmp_path)


def test_order_tests_are_skipped_when_the_order_is_unknown(tmp_path: Path) -> None:
    with pytest.raises(pytest.skip.Exception, match="eviction order is unknown"):
        run_suite_test(TestToyTierUnderSieve(), "test_touch_refreshes_recency", tmp_path)


def test_order_tests_ask_for_lru_when_make_tier_takes_a_policy(tmp_path: Path) -> None:
    asked: list[str | None] = []

    class Recording(TestToyTier):
        def make_tier(
            self, ctx: TierContext, capacity_bytes: int, eviction_policy: str = "arc"
        ) -> SecondaryTier:
            asked.append(eviction_policy)
            return super().make_tier(ctx, capacity_bytes, eviction_policy)

    run_suite_test(Recording(), "test_touch_refreshes_recency", tmp_path)
    run_suite_test(Recording(), "test_store_then_load_round_trip", tmp_path)
    assert asked == ["lru", "arc"]


def test_the_in_flight_test_needs_concurrent_jobs(tmp_path: Path) -> None:
    with pytest.raises(pytest.skip.Exception, match="concurrent_jobs"):
        run_suite_test(TestToyTierSerialStoresFirst(), "test_block_being_loaded_is_not_evicted",
                       tmp_path)


def test_a_tier_that_copies_on_the_callers_thread_is_named(tmp_path: Path) -> None:
    """The gated tests say so when the tier never reaches the pool from its own
    threads (here: it copies inside submit_store, which it must not)."""

    class CopiesInSubmit(ToyTier):
        def __init__(self, ctx: TierContext, config: dict[str, Any]):
            super().__init__(ctx, config)
            self._done: list[JobResult] = []

        def submit_store(self, job: TransferJob) -> None:
            self._done.append(self._store(job))

        def get_finished_jobs(self) -> list[JobResult]:
            done, self._done = self._done, []
            return done + super().get_finished_jobs()

    class Suite(_Toy):
        def make_tier(
            self, ctx: TierContext, capacity_bytes: int, eviction_policy: str = "arc"
        ) -> SecondaryTier:
            return CopiesInSubmit(ctx, {"capacity_bytes": capacity_bytes})

    with pytest.raises(AssertionError, match="never reached slot"):
        run_suite_test(Suite(), "test_store_is_no_hit_before_its_bytes_are_in", tmp_path)


def test_the_usage_test_is_skipped_without_stored_bytes(tmp_path: Path) -> None:
    with pytest.raises(pytest.skip.Exception, match=r"does not implement stored_bytes\(\)"):
        run_suite_test(_toy(set()), "test_store_holds_what_usage_reports", tmp_path)


@pytest.mark.parametrize("extra, overhead, message", [
    (100, 0, "blocks not deleted"),  # more on the store than the tier counts
    (-1, 0, "counts bytes its store does not hold"),
    (100, 100, None),  # a fixed extra the class states
])
def test_the_usage_test_compares_the_measure_with_usage(
    extra: int, overhead: int, message: str | None, tmp_path: Path
) -> None:
    class Measured(_DiskToy):
        stored_overhead_bytes = overhead

        def stored_bytes(self, tier: SecondaryTier) -> int:
            return super().stored_bytes(tier) + extra

    Measured.options = {}
    if message is None:
        run_suite_test(Measured(), "test_store_holds_what_usage_reports", tmp_path)
    else:
        with pytest.raises(AssertionError, match=message):
            run_suite_test(Measured(), "test_store_holds_what_usage_reports", tmp_path)
