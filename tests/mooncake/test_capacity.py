"""Capacity under random operations, checked against the master's own view:
after every step, the objects the master lists under the namespace are exactly
the blocks the tier counts - those it holds (within the quota) and those it
evicted whose removal a lease still holds back (a load read them within the
master's lease period) - and usage is their bytes; every load that succeeds
returns the bytes stored for its key."""

from __future__ import annotations

import random

from kvtiers import FailureReason
from kvtiers.testing import JobTracker, poison_slots, random_keys, wait_until

from tests.mooncake.helpers import Tiers, context
from tests.mooncake.master import Master

QUOTA_BLOCKS = 10
STEPS = 60


def test_random_operations_match_the_masters_view(master: Master, tiers: Tiers) -> None:
    rng = random.Random(20261206)
    ctx = context()
    bb = ctx.block_bytes
    tier = tiers.open(ctx, capacity_blocks=QUOTA_BLOCKS)
    jobs = JobTracker(tier, 30)
    universe = random_keys(3 * QUOTA_BLOCKS, rng)
    stored: dict[bytes, bytes] = {}  # every key's bytes, as last stored
    for step in range(STEPS):
        op = rng.choice(("store", "store", "load", "touch"))
        keys = rng.sample(universe, rng.randint(1, 6))
        slots = list(range(len(keys)))
        if op == "store":
            for slot, key in zip(slots, keys, strict=True):
                block = stored.get(key) or rng.randbytes(bb)
                ctx.pool.block(slot)[:] = block
                stored.setdefault(key, block)
            result = jobs.run_store(keys, slots)
            # REJECTED: its evicted object is still held by a lease (being removed)
            assert set(result.failed.values()) <= {FailureReason.FULL,
                                                   FailureReason.REJECTED}, result.failed
            assert not set(result.failed) & {k for k, _, _ in tier.index.items()}
        elif op == "load":
            dst = [20 + s for s in slots]
            poison_slots(ctx.pool, dst)
            result = jobs.run_load(keys, dst)
            for key, slot in zip(keys, dst, strict=True):
                if key in result.ok:
                    assert bytes(ctx.pool.block(slot)) == stored[key], f"step {step}"
                else:
                    assert result.failed[key] is FailureReason.MISSING
                    assert key not in tier.index
        else:
            tier.touch(keys)
        seen: dict[str, object] = {}

        def agree(seen: dict[str, object] = seen) -> bool:
            held = {k for k, _, _ in tier.index.items()}
            leaving = {tier.names.key_of(n) for n in tier.house.leaving()}
            usage = tier.stats().usage_bytes
            listed = tiers.stored(tier)
            seen.update(held=len(held), leaving=len(leaving), usage=usage, listed=len(listed))
            return listed == held | leaving and usage == len(held | leaving) * bb

        wait_until(agree, f"step {step}: the master's listing to match the tier ({seen})", 10)
        assert tier.index.committed_bytes <= QUOTA_BLOCKS * bb
    assert tier.stats().evictions > 0
    view = master.view()
    assert view.key_count == len(tiers.stored(tier))
    assert view.allocated_bytes >= tier.stats().usage_bytes
