"""A store that failed while the server was frozen (SIGSTOP) must not leave values
behind uncounted once the server runs again (SIGCONT): its SETs were in the
server's socket buffers and are carried out late. The tier takes them back, so what
the server holds stays exactly what the tier counts - without a start-up scan - and
a later store of the same keys is kept, not taken back."""

from __future__ import annotations

import time

from kvtiers import FailureReason
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    poison_slots,
    random_keys,
    wait_until,
)
from kvtiers_redis.tier import RedisTier

from tests.redis.helpers import BLOCK, Tiers, context
from tests.redis.server import RedisServer

TIMEOUT = 60.0
FAILURES = {FailureReason.IO, FailureReason.TIMEOUT}
#: how long the server's keys must keep matching the usage (late SETs land at once)
SETTLED_S = 3.0
CAPACITY_BLOCKS = 16


def _exact(tiers: Tiers, tier: RedisTier) -> bool:
    """The server holds exactly the blocks the tier counts (a raw SCAN)."""
    held = tiers.stored(tier)
    counted = {k for k, _, _ in tier.index.items()}
    return held == counted and len(held) * BLOCK == tier.stats().usage_bytes


def _wait_exact(tiers: Tiers, tier: RedisTier) -> None:
    """Poll until the server holds exactly what the tier counts and keeps doing so
    for `SETTLED_S` (exact for a moment is not enough: late requests land)."""
    since: list[float] = []

    def settled() -> bool:
        if not _exact(tiers, tier):
            since.clear()
            return False
        since[:] = since or [time.monotonic()]
        return time.monotonic() - since[0] >= SETTLED_S

    wait_until(settled, "the server's keys to match the tier's usage, and stay so", TIMEOUT)


def test_a_store_failed_while_the_server_was_frozen_leaves_nothing_uncounted(
        server: RedisServer, tiers: Tiers) -> None:
    ctx = context(clock=time.monotonic)
    # timeout_s far beyond the job's deadline: the deadline is what ends the store.
    tier = tiers.open(ctx, capacity_blocks=CAPACITY_BLOCKS, timeout_s=600)
    jobs = JobTracker(tier, timeout_s=TIMEOUT)
    pool = ctx.pool
    kept = random_keys(4)
    kept_data = fill_slots(pool, range(4))
    assert jobs.run_store(kept, range(4)).success

    late = random_keys(8)
    fill_slots(pool, range(8, 16))
    server.pause()
    try:
        result = jobs.run_store(late, range(8, 16), deadline=time.monotonic() + 0.5)
    finally:
        server.resume()
    assert result.failed and set(result.failed.values()) <= FAILURES, result
    assert not result.ok, result

    # The late SETs land once the server runs; the tier takes them back.
    _wait_exact(tiers, tier)
    assert tier.stats().usage_bytes <= CAPACITY_BLOCKS * BLOCK

    # The same keys stored again are kept (no late clean-up takes them) and load
    # back as stored.
    again = fill_slots(pool, range(8, 16))
    assert jobs.run_store(late, range(8, 16)).success
    _wait_exact(tiers, tier)
    assert tier.stats().usage_bytes == 12 * BLOCK <= CAPACITY_BLOCKS * BLOCK
    poison_slots(pool, range(20, 32))
    assert jobs.run_load([*kept, *late], range(20, 32)).success
    check_blocks(pool, list(zip(range(20, 32), [*kept_data, *again], strict=True)))


def test_a_store_right_after_the_freeze_is_not_taken_back(server: RedisServer,
                                                         tiers: Tiers) -> None:
    ctx = context(clock=time.monotonic)
    tier = tiers.open(ctx, capacity_blocks=CAPACITY_BLOCKS, timeout_s=600)
    jobs = JobTracker(tier, timeout_s=TIMEOUT)
    pool = ctx.pool
    keys = random_keys(8)
    fill_slots(pool, range(8))
    server.pause()
    try:
        result = jobs.run_store(keys, range(8), deadline=time.monotonic() + 0.5)
    finally:
        server.resume()
    assert result.failed and set(result.failed.values()) <= FAILURES, result

    # Stored again at once, while the failed store is still being taken back: the
    # new values are kept.
    data = fill_slots(pool, range(8))
    assert jobs.run_store(keys, range(8)).success
    _wait_exact(tiers, tier)
    assert tier.stats().usage_bytes == 8 * BLOCK
    poison_slots(pool, range(20, 28))
    assert jobs.run_load(keys, range(20, 28)).success
    check_blocks(pool, list(zip(range(20, 28), data, strict=True)))
