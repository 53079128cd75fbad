"""`ttl_s`: each block carries a Redis expiry (PX); the server deletes it on time,
the tier calls it a miss from then on, and a restart keeps the time left."""

from __future__ import annotations

from kvtiers import FailureReason, LookupResult
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    poison_slots,
    random_keys,
    wait_until,
)
from kvtiers_redis.transfers import wall_ms

from tests.redis.helpers import Tiers, context
from tests.redis.server import RedisServer


def test_each_block_carries_a_redis_expiry(server: RedisServer, tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, ttl_s=600)
    jobs = JobTracker(tier)
    keys = random_keys(3)
    data = fill_slots(ctx.pool, range(3))
    assert jobs.run_store(keys, range(3)).success
    with server.client() as raw:
        for key in keys:
            assert 0 < raw.pttl(tier.names.block(key)) <= 600_000
    assert [tier.lookup(k) for k in keys] == [LookupResult.HIT] * 3
    poison_slots(ctx.pool, range(8, 11))
    assert jobs.run_load(keys, range(8, 11)).success
    check_blocks(ctx.pool, zip(range(8, 11), data, strict=True))


def test_expired_blocks_are_misses(server: RedisServer, tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, ttl_s=0.5)
    jobs = JobTracker(tier)
    keys = random_keys(3)
    fill_slots(ctx.pool, range(3))
    assert jobs.run_store(keys, range(3)).success  # each SET acknowledged
    wait_until(lambda: not tiers.stored(tier), "Redis expiring the blocks", 30)
    assert [tier.lookup(k) for k in keys] == [LookupResult.MISS] * 3
    assert tier.stats().usage_bytes == 0
    result = jobs.run_load(keys, range(8, 11))
    assert result.failed == dict.fromkeys(keys, FailureReason.MISSING)


def test_a_restart_keeps_the_time_left(server: RedisServer, tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, ttl_s=600)
    keys = random_keys(2)
    data = fill_slots(ctx.pool, range(2))
    before = wall_ms()
    assert JobTracker(tier).run_store(keys, range(2)).success
    tier.close()
    tier = tiers.open(context(), ttl_s=600)
    for key in keys:
        expires = tier.index.get(key)
        assert expires is not None and before < expires <= wall_ms() + 600_000
    poison_slots(tier.ctx.pool, range(2))
    assert JobTracker(tier).run_load(keys, range(2)).success
    check_blocks(tier.ctx.pool, zip(range(2), data, strict=True))


def test_without_ttl_blocks_do_not_expire(server: RedisServer, tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx)
    keys = random_keys(2)
    fill_slots(ctx.pool, range(2))
    assert JobTracker(tier).run_store(keys, range(2)).success
    with server.client() as raw:
        assert [raw.pttl(tier.names.block(k)) for k in keys] == [-1, -1]
