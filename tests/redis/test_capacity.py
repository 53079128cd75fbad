"""The capacity bound under eviction, checked against what the server really holds:
after any sequence of stores, loads and touches the tier's usage never passes
capacity_bytes, the server holds exactly the tier's blocks once its deletes are
done, the survivors are the most recently used, every one byte-equal, and each
block that left is reported through `ctx.events`."""

from __future__ import annotations

import random

from kvtiers import LookupResult
from kvtiers.testing import JobTracker, check_blocks, fill_slots, poison_slots, random_keys

from tests.redis.helpers import BLOCK, Tiers, context
from tests.redis.server import RedisServer

CAPACITY = 8


def test_eviction_keeps_the_bound_and_the_most_recent(server: RedisServer,
                                                      tiers: Tiers) -> None:
    rng = random.Random()
    ctx = context()
    ctx.events.enable()
    tier = tiers.open(ctx, capacity_blocks=CAPACITY)
    jobs = JobTracker(tier)
    data: dict[bytes, bytes] = {}
    recent: list[bytes] = []  # least recently used first
    removed: list[bytes] = []

    def used(keys: list[bytes]) -> None:
        for k in keys:
            if k in recent:
                recent.remove(k)
            recent.append(k)

    for _ in range(30):
        if recent and rng.random() < 0.3:  # load some of what is held
            keys = rng.sample(recent[-CAPACITY:], min(3, len(recent[-CAPACITY:])))
            poison_slots(ctx.pool, range(20, 20 + len(keys)))
            assert jobs.run_load(keys, range(20, 20 + len(keys))).success
            check_blocks(ctx.pool, [(20 + i, data[k]) for i, k in enumerate(keys)])
            used(keys)
        else:
            keys = random_keys(rng.randint(1, 4), rng)
            for k, d in zip(keys, fill_slots(ctx.pool, range(len(keys)), rng), strict=True):
                data[k] = d
            assert jobs.run_store(keys, range(len(keys))).success
            used(keys)
        assert tier.stats().usage_bytes <= CAPACITY * BLOCK
        removed += ctx.events.take()

    survivors = recent[-CAPACITY:]
    assert [tier.lookup(k) for k in survivors] == [LookupResult.HIT] * CAPACITY
    gone = recent[:-CAPACITY]
    assert [tier.lookup(k) for k in gone] == [LookupResult.MISS] * len(gone)
    assert sorted(removed) == sorted(gone), "removals reported are not the evicted blocks"
    poison_slots(ctx.pool, range(CAPACITY))
    assert jobs.run_load(survivors, range(CAPACITY)).success
    check_blocks(ctx.pool, [(i, data[k]) for i, k in enumerate(survivors)])
    tier.close()  # its background deletes end before it is closed
    assert tiers.stored(tier) == set(survivors)


def test_a_job_larger_than_the_tier_keeps_its_own_blocks(server: RedisServer,
                                                         tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=3)
    keys = random_keys(5)
    data = fill_slots(ctx.pool, range(5))
    result = JobTracker(tier).run_store(keys, range(5))
    assert result.ok == keys[:3] and set(result.failed) == set(keys[3:]), result
    poison_slots(ctx.pool, range(8, 11))
    assert JobTracker(tier).run_load(keys[:3], range(8, 11)).success
    check_blocks(ctx.pool, zip(range(8, 11), data[:3], strict=True))
    assert tiers.stored(tier) == set(keys[:3])
