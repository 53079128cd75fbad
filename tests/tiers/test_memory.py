"""The `memory` tier: the conformance suite, plus what is particular to it
(eviction by the configured policy, pins held by pending loads, its config)."""

from __future__ import annotations

import mmap
import threading
from collections.abc import Hashable
from typing import Any, ClassVar

import pytest
from kvtiers import ConfigError, FailureReason, LookupResult, SecondaryTier, TierContext
from kvtiers.config.model import TierSection
from kvtiers.contract import CONTRACT_VERSION, create_tier
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.pool_view import PoolView, round_up
from kvtiers.errors import UnknownNameError
from kvtiers.plugins import PolicyRecord, Registered, TierRecord, get_registry
from kvtiers.plugins.registry import Registry
from kvtiers.policies.lru import LRUPolicy
from kvtiers.testing import (
    JobTracker,
    TierConformance,
    fill_slots,
    make_context,
    make_namespace,
    poison_slots,
    random_keys,
    resolve_lookup,
)
from kvtiers.tiers import MemoryTier

BB = 16384


class TestMemoryConformance(TierConformance):
    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        return MemoryTier(ctx, {"capacity_bytes": capacity_bytes})

    def corrupt(self, tier: SecondaryTier, key: BlockKey) -> None:
        assert isinstance(tier, MemoryTier) and tier.damage(key)


class TestMemoryConformanceFourThreads(TestMemoryConformance):
    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        return MemoryTier(ctx, {"capacity_bytes": capacity_bytes, "threads": 4})


class TestMemoryConformanceOddBlocks(TestMemoryConformance):
    """Blocks smaller than their 4 KiB-aligned slots: the padding is never written."""

    block_bytes: ClassVar[int] = 5000


@pytest.fixture
def ctx() -> TierContext:
    return make_context(BB, 16)


def memory(ctx: TierContext, tiers: list[SecondaryTier], **options: Any) -> MemoryTier:
    tier = MemoryTier(ctx, {"capacity_bytes": 4 * BB, **options})
    tiers.append(tier)
    return tier


def store_one_by_one(tier: SecondaryTier, jobs: JobTracker, keys: list[BlockKey]) -> None:
    for key in keys:
        fill_slots(tier.ctx.pool, [0])
        assert jobs.run_store([key], [0]).success


def present(tier: SecondaryTier, keys: list[BlockKey]) -> list[bool]:
    return [resolve_lookup(tier, k) is LookupResult.HIT for k in keys]


# Eviction follows the policy.


def test_lru_keeps_what_was_used(ctx: TierContext, tiers: list[SecondaryTier]) -> None:
    tier = memory(ctx, tiers)
    jobs = JobTracker(tier)
    a, b, c, d, e, f = random_keys(6)
    store_one_by_one(tier, jobs, [a, b, c, d])
    assert jobs.run_load([a], [5]).success  # a load is a use
    store_one_by_one(tier, jobs, [e])
    assert present(tier, [a, b, c, d, e]) == [True, False, True, True, True]
    tier.touch([c])
    store_one_by_one(tier, jobs, [f])
    assert present(tier, [a, c, d, e, f]) == [True, True, False, True, True]
    assert tier.stats().evictions == 2


class _NewestFirst(LRUPolicy):
    """Evicts the most recently inserted entry: the opposite of LRU."""

    def evict(self, n: int = 1) -> list[Hashable]:
        victims = list(reversed(self._order))[:n]
        for key in victims:
            del self._order[key]
        return victims


def registry_with(policy: type, name: str = "newest-first") -> Registry:
    registry = Registry()
    core = get_registry()
    registry.tiers.update(core.tiers)
    registry.policies.update(core.policies)
    record = PolicyRecord(name, policy, "test policy", CONTRACT_VERSION)
    registry.policies[name] = Registered(record, "test", "test", "0")
    return registry


def test_evicts_with_the_configured_policy(ctx: TierContext, tiers: list[SecondaryTier]) -> None:
    section = TierSection("memory", {"capacity_bytes": 4 * BB, "eviction_policy": "newest-first"})
    tier = create_tier(section, ctx, registry_with(_NewestFirst))
    tiers.append(tier)
    jobs = JobTracker(tier)
    keys = random_keys(5)
    store_one_by_one(tier, jobs, keys)
    assert present(tier, keys) == [True, True, True, False, True]


def test_unknown_policy_names_the_installed_ones(ctx: TierContext) -> None:
    with pytest.raises(UnknownNameError, match="lru"):
        MemoryTier(ctx, {"capacity_bytes": BB, "eviction_policy": "lruu"})


# Pins held by pending loads.


class GatedPool(PoolView):
    """A pool whose `gated` slots block worker threads until `gate` is set, so a
    test can hold a load in the middle of its copy."""

    def __init__(self, num_slots: int, block_bytes: int):
        super().__init__(mmap.mmap(-1, num_slots * round_up(block_bytes)), block_bytes)
        self.gated: set[int] = set()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def block(self, slot: int) -> memoryview:
        if slot in self.gated and threading.current_thread() is not threading.main_thread():
            self.entered.set()
            assert self.gate.wait(30), "test never opened the gate"
        return super().block(slot)


@pytest.fixture
def gated_ctx() -> TierContext:
    return TierContext(GatedPool(16, BB), make_namespace(block_bytes=BB))


@pytest.fixture
def gated(
    gated_ctx: TierContext, tiers: list[SecondaryTier]
) -> tuple[GatedPool, MemoryTier, JobTracker]:
    """A two-block memory tier over a pool whose copies into chosen slots wait at a gate."""
    pool = gated_ctx.pool
    assert isinstance(pool, GatedPool)
    tier = memory(gated_ctx, tiers, capacity_bytes=2 * BB, threads=2)
    return pool, tier, JobTracker(tier)


def test_a_block_being_loaded_is_not_evicted(
    gated: tuple[GatedPool, MemoryTier, JobTracker],
) -> None:
    pool, tier, jobs = gated
    oldest, other, new = random_keys(3)
    data = fill_slots(pool, [0])[0]
    assert jobs.run_store([oldest], [0]).success
    store_one_by_one(tier, jobs, [other])
    pool.gated.add(5)
    poison_slots(pool, [5])
    load = jobs.load([oldest], [5])
    assert pool.entered.wait(30)
    # The LRU victim is `oldest`, but a load of it is pending: `other` goes instead.
    fill_slots(pool, [1])
    assert jobs.run_store([new], [1]).success
    pool.gate.set()
    assert jobs.wait([load])[0].success
    assert bytes(pool.block(5)) == data
    assert present(tier, [oldest, other, new]) == [True, False, True]


def test_store_is_full_when_every_block_is_being_loaded(
    gated: tuple[GatedPool, MemoryTier, JobTracker],
) -> None:
    pool, tier, jobs = gated
    a, b, c = random_keys(3)
    fill_slots(pool, [0, 1])
    assert jobs.run_store([a, b], [0, 1]).success
    pool.gated.add(5)
    load = jobs.load([a, b], [5, 6])
    assert pool.entered.wait(30)
    fill_slots(pool, [2])
    assert jobs.run_store([c], [2]).failed == {c: FailureReason.FULL}
    pool.gate.set()
    assert jobs.wait([load])[0].success
    assert tier.stats().evictions == 0
    # Unpinned again: the next store can evict.
    assert jobs.run_store([c], [2]).success


# Worker-side behaviour.


def test_usage_is_block_bytes_and_corrupt_copies_are_dropped(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = memory(ctx, tiers)
    jobs = JobTracker(tier)
    keys = random_keys(3)
    fill_slots(ctx.pool, range(3))
    assert jobs.run_store(keys, range(3)).success
    assert tier.stats().usage_bytes == 3 * BB
    assert tier.damage(keys[1])
    assert not tier.damage(random_keys(1)[0])
    result = jobs.run_load(keys, range(4, 7))
    assert result.failed == {keys[1]: FailureReason.CORRUPT}
    assert tier.stats().usage_bytes == 2 * BB


def test_a_bad_slot_fails_its_key_with_io(ctx: TierContext, tiers: list[SecondaryTier]) -> None:
    tier = memory(ctx, tiers)
    jobs = JobTracker(tier)
    good, bad = random_keys(2)
    fill_slots(ctx.pool, [0])
    result = jobs.run_store([good, bad], [0, 10_000])
    assert result.ok == [good] and result.failed == {bad: FailureReason.IO}
    assert tier.stats().usage_bytes == BB  # the failed key's reservation was released


def test_a_job_past_its_deadline_does_not_run(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    tier = memory(ctx, tiers)
    jobs = JobTracker(tier)
    key = random_keys(1)[0]
    fill_slots(ctx.pool, [0])
    result = jobs.run_store([key], [0], deadline=ctx.clock() - 1.0)
    assert result.failed == {key: FailureReason.TIMEOUT}
    assert resolve_lookup(tier, key) is LookupResult.MISS


def test_close_frees_the_blocks(ctx: TierContext, tiers: list[SecondaryTier]) -> None:
    tier = memory(ctx, tiers)
    keys = random_keys(2)
    fill_slots(ctx.pool, [0, 1])
    assert JobTracker(tier).run_store(keys, [0, 1]).success
    tier.close()
    assert tier.stats().usage_bytes == 0
    assert tier.lookup(keys[0]) is LookupResult.MISS


# Config.


def test_defaults_are_filled(ctx: TierContext, tiers: list[SecondaryTier]) -> None:
    tier = memory(ctx, tiers)
    assert tier.config == {"capacity_bytes": 4 * BB, "eviction_policy": "lru", "threads": 1}
    assert tier.stats().capacity_bytes == 4 * BB


@pytest.mark.parametrize(
    "options, path",
    [
        ({}, "$.capacity_bytes"),
        ({"capacity_bytes": 0}, "$.capacity_bytes"),
        ({"capacity_bytes": "1G"}, "$.capacity_bytes"),
        ({"capacity_bytes": BB, "threads": 0}, "$.threads"),
        ({"capacity_bytes": BB, "thread": 2}, "$"),
    ],
)
def test_bad_options_are_config_errors(
    ctx: TierContext, options: dict[str, Any], path: str
) -> None:
    with pytest.raises(ConfigError) as err:
        MemoryTier(ctx, options)
    assert [p.path for p in err.value.problems] == [path]


def test_registered_record(ctx: TierContext) -> None:
    record = get_registry().get_tier("memory").record
    assert isinstance(record, TierRecord) and record.load() is MemoryTier
    assert MemoryTier.verifies and not MemoryTier.persistent and not MemoryTier.shared


def test_blocks_that_leave_are_reported_to_the_context_events(
    ctx: TierContext, tiers: list[SecondaryTier]
) -> None:
    ctx.events.enable()
    tier = memory(ctx, tiers, capacity_bytes=2 * BB)
    jobs = JobTracker(tier)
    a, b, c = random_keys(3)
    store_one_by_one(tier, jobs, [a, b, c])  # c evicts a
    assert ctx.events.take() == [a]
    assert tier.damage(b)
    assert jobs.run_load([b], [5]).failed == {b: FailureReason.CORRUPT}
    assert ctx.events.take() == [b]
    tier.close()  # the RAM is freed: c leaves too
    assert ctx.events.take() == [c]
