"""Run as a process of its own by test_restart: store blocks through a RedisTier,
then die by SIGKILL without closing it (no recency manifest written).

argv: url prefix capacity_blocks seed count. Keys and bytes come from `seed`, so the
test knows what was stored."""

from __future__ import annotations

import os
import random
import signal
import sys

from kvtiers.testing import JobTracker, fill_slots, random_keys
from kvtiers_redis.tier import RedisTier

from tests.redis.helpers import BLOCK, context


def main() -> None:
    url, prefix, capacity, seed, count = sys.argv[1:6]
    rng = random.Random(int(seed))
    keys = random_keys(int(count), rng)
    ctx = context()
    fill_slots(ctx.pool, range(int(count)), rng)
    tier = RedisTier(ctx, {"url": url, "prefix": prefix,
                           "capacity_bytes": int(capacity) * BLOCK})
    for i, key in enumerate(keys):  # one job each: stored in this order
        assert JobTracker(tier).run_store([key], [i]).success
    print("stored", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
