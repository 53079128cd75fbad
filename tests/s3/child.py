"""Another engine, in a process of its own: opens the s3 tier on the same prefix and
namespace as the test and stores blocks whose keys and bytes follow from a seed
(so the test can recompute them), then exits (closing the tier).

    python -m tests.s3.child OPTIONS_JSON SEED N
"""

from __future__ import annotations

import json
import random
import sys

from kvtiers.testing import JobTracker, fill_slots, make_context, random_keys
from kvtiers_s3.tier import S3Tier

BLOCK = 16384


def blocks(seed: int, n: int) -> tuple[list[bytes], random.Random]:
    """The keys a child with `seed` stores, and the generator of their bytes."""
    rng = random.Random(seed)
    return random_keys(n, rng), rng


def main() -> int:
    options, seed, n = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ctx = make_context(BLOCK, n)
    tier = S3Tier(ctx, options)
    try:
        keys, rng = blocks(seed, n)
        fill_slots(ctx.pool, range(n), rng)
        result = JobTracker(tier, 60).run_store(keys, range(n))
        print(json.dumps({"ok": len(result.ok), "failed": len(result.failed)}))
        return 0 if result.success else 1
    finally:
        tier.close()


if __name__ == "__main__":
    sys.exit(main())
