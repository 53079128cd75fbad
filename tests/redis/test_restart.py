"""Warm restarts: the index is rebuilt from a SCAN of the namespace's names, in the
recency order the last close wrote down; what a process killed since stored counts
as the newest; a smaller capacity deletes the oldest; the server's own restart
(append-only file) keeps every block."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from kvtiers import LookupResult
from kvtiers.testing import JobTracker, check_blocks, fill_slots, poison_slots, random_keys

from tests.redis.helpers import BLOCK, Tiers, context
from tests.redis.server import RedisServer

REPO = Path(__file__).resolve().parents[2]


def test_blocks_of_a_killed_process_are_kept_and_count_as_newest(
        server: RedisServer, tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=8)
    old = random_keys(4)
    fill_slots(ctx.pool, range(4))
    assert JobTracker(tier).run_store(old, range(4)).success
    tier.close()  # a clean close: the manifest names `old`

    seed = random.randrange(1 << 30)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.redis.crash_child", server.url, tiers.prefix, "8",
         str(seed), "4"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and "stored" in proc.stdout, proc.stdout + proc.stderr
    rng = random.Random(seed)
    crashed = random_keys(4, rng)
    ctx2 = context()
    crashed_data = fill_slots(ctx2.pool, range(4), rng)  # the child's bytes, made again

    tier = tiers.open(ctx2, capacity_blocks=8)
    assert all(tier.lookup(k) is LookupResult.HIT for k in old + crashed)
    poison_slots(ctx2.pool, range(8, 12))
    jobs = JobTracker(tier)
    assert jobs.run_load(crashed, range(8, 12)).success
    check_blocks(ctx2.pool, zip(range(8, 12), crashed_data, strict=True), "the killed writer's")
    new = random_keys(4)
    fill_slots(ctx2.pool, range(16, 20))
    assert jobs.run_store(new, range(16, 20)).success  # the full tier evicts four...
    assert [tier.lookup(k) for k in old] == [LookupResult.MISS] * 4  # ...the oldest
    assert all(tier.lookup(k) is LookupResult.HIT for k in crashed + new)
    tier.close()
    assert tiers.stored(tier) == set(crashed + new)


def test_a_smaller_capacity_at_restart_deletes_the_oldest(server: RedisServer,
                                                           tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=8)
    keys = random_keys(8)
    data = fill_slots(ctx.pool, range(8))
    jobs = JobTracker(tier)
    for i, key in enumerate(keys):
        assert jobs.run_store([key], [i]).success
    tier.touch(keys[:2])  # used again: now the newest two
    tier.close()

    ctx2 = context()
    tier = tiers.open(ctx2, capacity_blocks=4)
    assert tier.stats().usage_bytes == 4 * BLOCK
    kept = keys[6:] + keys[:2]
    assert [tier.lookup(k) is LookupResult.HIT for k in keys] == [
        True, True, False, False, False, False, True, True]
    poison_slots(ctx2.pool, range(4))
    assert JobTracker(tier).run_load(kept, range(4)).success
    check_blocks(ctx2.pool, zip(range(4), data[6:] + data[:2], strict=True))
    tier.close()
    assert tiers.stored(tier) == set(kept), "the values that no longer fit were not deleted"


def test_the_server_restarting_keeps_every_block(server: RedisServer, tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=16)
    keys = random_keys(10)
    data = fill_slots(ctx.pool, range(10))
    assert JobTracker(tier).run_store(keys, range(10)).success
    tier.close()
    server.kill()  # kill -9: only the append-only file (fsync always) remains
    server.start()
    ctx2 = context()
    tier = tiers.open(ctx2, capacity_blocks=16)
    assert tier.stats().usage_bytes == 10 * BLOCK
    poison_slots(ctx2.pool, range(10, 20))
    assert JobTracker(tier).run_load(keys, range(10, 20)).success
    check_blocks(ctx2.pool, zip(range(10, 20), data, strict=True))
