"""Another engine process on the same master: builds a `mooncake` tier, stores
`n` blocks whose keys and bytes follow from `seed` (the test derives the same),
says `stored` on stdout and waits for a line on stdin; `load` mode instead loads
the keys and reports how many came back with the right bytes.

    python -m tests.mooncake.engine_child MASTER PREFIX SEED N store|load

Run inside the test's network namespace (`ip netns exec`).
"""

from __future__ import annotations

import random
import sys

from kvtiers import LookupResult
from kvtiers.testing import JobTracker, check_blocks, poison_slots, resolve_lookup
from kvtiers_mooncake.tier import MooncakeTier

from tests.mooncake.helpers import context


def blocks(seed: int, n: int, block_bytes: int) -> list[tuple[bytes, bytes]]:
    """(key, block bytes) of the seed's blocks."""
    rng = random.Random(seed)
    return [(rng.randbytes(32) + bytes(4), rng.randbytes(block_bytes)) for _ in range(n)]


def main(master: str, prefix: str, seed: int, n: int, mode: str) -> int:
    ctx = context()
    tier = MooncakeTier(ctx, {"master_address": master, "prefix": prefix,
                              "capacity_bytes": 64 * ctx.block_bytes})
    jobs = JobTracker(tier, 30.0)
    made = blocks(seed, n, ctx.block_bytes)
    if mode == "store":
        for slot, (_, data) in enumerate(made):
            ctx.pool.block(slot)[:] = data
        result = jobs.run_store([k for k, _ in made], range(n))
        assert result.success, result.failed
        print("stored", flush=True)
        sys.stdin.readline()
    else:
        for key, _ in made:
            assert resolve_lookup(tier, key, 30.0) is LookupResult.HIT
        poison_slots(ctx.pool, range(n))
        result = jobs.run_load([k for k, _ in made], range(n))
        assert result.success, result.failed
        check_blocks(ctx.pool, [(s, d) for s, (_, d) in enumerate(made)])
        print(f"loaded {n}", flush=True)
    tier.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
