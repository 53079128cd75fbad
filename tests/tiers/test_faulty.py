"""The `faulty` tier: transparent with faults off, and each fault kind, reproducibly."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar

import pytest
from kvtiers import ConfigError, FailureReason, LookupResult, SecondaryTier, TierContext
from kvtiers.config.model import TierSection
from kvtiers.contract import CONTRACT_VERSION, create_tier
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.keys import BlockKey
from kvtiers.plugins import Registered, TierRecord, get_registry
from kvtiers.plugins.registry import Registry
from kvtiers.testing import (
    JobTracker,
    TierConformance,
    fill_slots,
    make_context,
    poison_slots,
    random_keys,
)
from kvtiers.tiers import FaultyTier, MemoryTier

BB = 16384
CAPACITY = 256 * BB


def faulty_section(capacity_bytes: int = CAPACITY, **faults: Any) -> TierSection:
    inner = TierSection("memory", {"capacity_bytes": capacity_bytes}, "$.inner")
    return TierSection("faulty", {"inner": inner, **faults})


class TestFaultyOverMemoryWithFaultsOff(TierConformance):
    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        return create_tier(faulty_section(capacity_bytes), ctx)

    def corrupt(self, tier: SecondaryTier, key: BlockKey) -> None:
        assert isinstance(tier, FaultyTier) and isinstance(tier.inner, MemoryTier)
        assert tier.inner.damage(key)


class TestFaultyWithFaultsOnOtherOps(TestFaultyOverMemoryWithFaultsOff):
    """Job faults configured but confined to `ops: [lookup]`: jobs pass untouched."""

    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        return create_tier(
            faulty_section(capacity_bytes, error_rate=1.0, latency_s=3.0, ops=["lookup"]), ctx
        )


@pytest.fixture
def ctx() -> TierContext:
    return make_context(BB, 64)


def faulty(ctx: TierContext, tiers: list[SecondaryTier], **faults: Any) -> FaultyTier:
    tier = create_tier(faulty_section(**faults), ctx)
    assert isinstance(tier, FaultyTier)
    tiers.append(tier)
    return tier


def stored_through_inner(tier: FaultyTier, n: int) -> tuple[list[BlockKey], list[bytes]]:
    """`n` blocks stored directly in the inner tier, from slots 0..n-1."""
    keys = random_keys(n)
    data = fill_slots(tier.ctx.pool, range(n))
    assert JobTracker(tier.inner).run_store(keys, range(n)).success
    return keys, data


# Errors and misses.


def test_error_rate_one_fails_every_key_without_forwarding(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers, error_rate=1.0)
    keys = random_keys(4)
    fill_slots(ctx.pool, range(4))
    result = JobTracker(tier).run_store(keys, range(4))
    assert result.failed == {k: FailureReason.IO for k in keys}
    assert [tier.inner.lookup(k) for k in keys] == [LookupResult.MISS] * 4
    assert tier.faults["error"] == 4
    assert tier.stats().errors == {"io": 4}


def failed_positions(seed: int, rate: float = 0.5) -> list[int]:
    ctx = make_context(BB, 64)
    tier = create_tier(faulty_section(error_rate=rate, seed=seed), ctx)
    try:
        keys = random_keys(64)
        fill_slots(ctx.pool, range(64))
        result = JobTracker(tier).run_store(keys, range(64))
        for key in result.ok:  # the others really were forwarded and stored
            assert isinstance(tier, FaultyTier) and tier.inner.lookup(key) is LookupResult.HIT
        return [i for i, k in enumerate(keys) if k in result.failed]
    finally:
        tier.close()


def test_errors_are_per_key_and_determined_by_the_seed() -> None:
    first = failed_positions(seed=3)
    assert 0 < len(first) < 64
    assert failed_positions(seed=3) == first
    assert any(failed_positions(seed=s) != first for s in (4, 5, 6))


def test_the_error_pattern_does_not_depend_on_other_faults() -> None:
    ctx = make_context(BB, 64)
    tier = create_tier(faulty_section(error_rate=0.5, seed=3, corrupt_rate=0.5), ctx)
    try:
        keys = random_keys(64)
        fill_slots(ctx.pool, range(64))
        result = JobTracker(tier).run_store(keys, range(64))
        assert [i for i, k in enumerate(keys) if k in result.failed] == failed_positions(seed=3)
    finally:
        tier.close()


def test_miss_rate_hides_blocks_the_inner_tier_has(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers, miss_rate=1.0)
    keys, _ = stored_through_inner(tier, 2)
    assert [tier.lookup(k) for k in keys] == [LookupResult.MISS] * 2
    assert tier.faults["miss"] == 2 and tier.stats().misses == 2


def test_faults_apply_only_to_the_listed_ops(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers, error_rate=1.0, ops=["load"])
    jobs = JobTracker(tier)
    keys = random_keys(2)
    fill_slots(ctx.pool, range(2))
    assert jobs.run_store(keys, range(2)).success
    assert set(jobs.run_load(keys, [4, 5]).failed.values()) == {FailureReason.IO}


# Time: latency, hangs, deadlines (ManualClock, no sleeping).


def manual(tier: SecondaryTier) -> ManualClock:
    clock = tier.ctx.clock
    assert isinstance(clock, ManualClock)
    return clock


def test_latency_holds_a_job_until_the_clock_passes_it(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers, latency_s=5.0)
    clock, jobs = manual(tier), JobTracker(tier)
    key = random_keys(1)[0]
    fill_slots(ctx.pool, [0])
    job = jobs.store([key], [0])
    assert tier.inner.drain(5) and jobs.poll() == []
    clock.advance(4.9)
    assert jobs.poll() == [] and tier.inner.lookup(key) is LookupResult.MISS
    assert tier.drain(0.01) is False  # held: only the clock can release it
    clock.advance(0.2)
    assert jobs.wait([job])[0].success
    assert tier.inner.lookup(key) is LookupResult.HIT


def test_a_job_held_past_its_deadline_times_out_and_is_never_forwarded(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers, latency_s=5.0)
    clock, jobs = manual(tier), JobTracker(tier)
    key = random_keys(1)[0]
    fill_slots(ctx.pool, [0])
    job = jobs.store([key], [0], deadline=clock() + 1.0)
    clock.advance(10.0)
    assert jobs.wait([job])[0].failed == {key: FailureReason.TIMEOUT}
    assert tier.drain(5) and tier.inner.lookup(key) is LookupResult.MISS
    assert tier.faults["timeout"] == 1 and tier.stats().errors == {"timeout": 1}


def test_a_finite_hang_ends_and_the_job_then_runs(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers, hang_rate=1.0, hang_s=60.0)
    clock, jobs = manual(tier), JobTracker(tier)
    keys, data = stored_through_inner(tier, 2)
    poison_slots(ctx.pool, [8, 9])
    job = jobs.load(keys, [8, 9])
    clock.advance(59.0)
    assert jobs.poll() == []
    clock.advance(1.0)
    assert jobs.wait([job])[0].success
    assert [bytes(ctx.pool.block(s)) for s in (8, 9)] == data
    assert tier.faults["hang"] == 1


def test_an_endless_hang_without_deadline_ends_only_at_close(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers, hang_rate=1.0)
    clock, jobs = manual(tier), JobTracker(tier)
    keys, _ = stored_through_inner(tier, 1)
    poison_slots(ctx.pool, [8])
    before = bytes(ctx.pool.block(8))
    job = jobs.load(keys, [8])
    clock.advance(1e9)
    assert jobs.poll() == [] and tier.drain(0.01) is False
    tier.close()
    assert jobs.wait([job])[0].failed == {keys[0]: FailureReason.CLOSED}
    assert bytes(ctx.pool.block(8)) == before


def test_hangs_hit_the_drawn_jobs_only(ctx: TierContext, tiers: list[SecondaryTier]) -> None:
    tier = faulty(ctx, tiers, hang_rate=0.5, seed=11)
    jobs = JobTracker(tier)
    keys = random_keys(20)
    fill_slots(ctx.pool, range(20))
    submitted = [jobs.store([k], [i]) for i, k in enumerate(keys)]
    hung = tier.faults["hang"]
    assert 0 < hung < 20
    assert tier.drain(0.01) is False
    jobs.wait([j for j in submitted if resolve_inner_after(tier, j.keys[0])])
    assert len(jobs.outstanding) == hung


def resolve_inner_after(tier: FaultyTier, key: BlockKey) -> bool:
    """True once the inner tier holds `key` (the job was forwarded and ran)."""
    tier.inner.drain(5)
    return tier.inner.lookup(key) is LookupResult.HIT


# Corruption.


def test_detected_corruption_is_reported_corrupt(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers, corrupt_rate=1.0)
    keys, _ = stored_through_inner(tier, 3)
    result = JobTracker(tier).run_load(keys, [8, 9, 10])
    assert result.failed == {k: FailureReason.CORRUPT for k in keys}
    assert result.bytes_moved == 0
    assert tier.faults["corrupt"] == 3 and tier.stats().errors == {"corrupt": 3}
    assert tier.verifies


def test_undetected_corruption_serves_wrong_bytes(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers, corrupt_rate=1.0, corrupt_detected=False)
    keys, data = stored_through_inner(tier, 3)
    result = JobTracker(tier).run_load(keys, [8, 9, 10])
    assert result.success and result.bytes_moved == 3 * BB
    for slot, want in zip((8, 9, 10), data, strict=True):
        got = bytes(ctx.pool.block(slot))
        assert sum(x != y for x, y in zip(got, want, strict=True)) == 1  # one flipped byte
    assert not tier.verifies  # it serves wrong bytes: it does not verify


def test_corruption_never_touches_stores(ctx: TierContext, tiers: list[SecondaryTier]) -> None:
    tier = faulty(ctx, tiers, corrupt_rate=1.0)
    jobs = JobTracker(tier)
    keys = random_keys(2)
    data = fill_slots(ctx.pool, range(2))
    assert jobs.run_store(keys, range(2)).success
    assert [bytes(ctx.pool.block(s)) for s in range(2)] == data
    assert JobTracker(tier.inner).run_load(keys, [4, 5]).success


# Flags, config, ownership.


class _PersistentShared(MemoryTier):
    persistent: ClassVar[bool] = True
    shared: ClassVar[bool] = True


def registry_with_sticky() -> Registry:
    registry = Registry()
    core = get_registry()
    registry.tiers.update(core.tiers)
    registry.policies.update(core.policies)
    record = TierRecord("sticky", _PersistentShared, {}, "test tier", CONTRACT_VERSION)
    registry.tiers["sticky"] = Registered(record, "test", "test", "0")
    return registry


def test_flags_are_the_inner_tiers(ctx: TierContext, tiers: list[SecondaryTier]) -> None:
    assert not (FaultyTier.persistent or FaultyTier.shared or FaultyTier.verifies)
    over_memory = faulty(ctx, tiers)
    assert over_memory.verifies and not over_memory.persistent and not over_memory.shared
    inner = TierSection("sticky", {"capacity_bytes": CAPACITY}, "$.inner")
    # The nested tier resolves in the registry create_tier was given.
    tier = create_tier(TierSection("faulty", {"inner": inner}), ctx, registry_with_sticky())
    tiers.append(tier)
    assert isinstance(tier, FaultyTier) and isinstance(tier.inner, _PersistentShared)
    assert tier.persistent and tier.shared and tier.verifies and not tier.serves_peers


@pytest.mark.parametrize(
    "inner",
    [
        {"type": "memory", "capacity_bytes": CAPACITY},
        TierSection("memory", {"capacity_bytes": CAPACITY}),
    ],
)
def test_inner_as_section_or_mapping(ctx: TierContext, inner: Any) -> None:
    tier = FaultyTier(ctx, {"inner": inner})
    try:
        assert isinstance(tier.inner, MemoryTier)
        assert tier.inner.ctx.name == f"{ctx.name}.inner" and tier.inner.ctx.pool is ctx.pool
        assert tier.config["error_rate"] == 0 and tier.config["hang_s"] is None
    finally:
        tier.close()


@pytest.mark.parametrize(
    "options, path",
    [
        ({}, "$.inner"),
        ({"inner": "memory"}, "$.inner"),
        ({"inner": {"type": "memory", "capacity_bytes": BB}, "error_rate": 1.5}, "$.error_rate"),
        ({"inner": {"type": "memory", "capacity_bytes": BB}, "ops": ["write"]}, "$.ops[0]"),
    ],
)
def test_bad_options_are_config_errors(ctx: TierContext, options: Any, path: str) -> None:
    with pytest.raises(ConfigError) as err:
        FaultyTier(ctx, options)
    assert [p.path for p in err.value.problems] == [path]


def test_wrap_owns_the_inner_tier(ctx: TierContext) -> None:
    inner = MemoryTier(ctx, {"capacity_bytes": CAPACITY})
    tier = FaultyTier.wrap(inner, error_rate=0.0)
    assert tier.inner is inner and tier.ctx is inner.ctx
    tier.close()
    key = random_keys(1)[0]
    result = JobTracker(inner).run_store([key], [0])
    assert result.failed == {key: FailureReason.CLOSED}


def test_stats_usage_and_capacity_are_the_inner_tiers(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = faulty(ctx, tiers)
    keys = random_keys(3)
    fill_slots(ctx.pool, range(3))
    assert JobTracker(tier).run_store(keys, range(3)).success
    stats = tier.stats()
    assert stats.usage_bytes == 3 * BB and stats.capacity_bytes == CAPACITY
    assert stats.blocks_written == 3 and stats.bytes_written == 3 * BB


def test_accepts_a_loaded_configs_read_only_options(ctx: TierContext) -> None:
    from kvtiers.config.model import freeze

    inner = TierSection("memory", freeze({"capacity_bytes": CAPACITY}), "$.inner")
    options = freeze({"error_rate": 1.0, "ops": ["load"]})
    tier = FaultyTier(ctx, MappingProxyType({"inner": inner, **options}))
    try:
        assert tier.config["ops"] == ("load",)
        key = random_keys(1)[0]
        fill_slots(ctx.pool, [0])
        assert JobTracker(tier).run_store([key], [0]).success  # stores are not faulted
    finally:
        tier.close()
