"""`FsTier.inventory()` (kvtiers.contract.inventory) says what the tier holds, and removals -
evictions, damaged blocks dropped, blocks another process removed - reach
`ctx.events` as keys."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kvtiers.contract.inventory import TierInventory
from kvtiers.testing import random_keys

from tests.fs.helpers import FILE, context, load_and_check, open_tier, store_keys


def test_inventory_lists_keys_sizes_ages_and_usage(tmp_path: Path) -> None:
    roots = [str(tmp_path / "r0"), str(tmp_path / "r1")]
    for r in roots:
        os.mkdir(r)
    before = time.time()
    tier = open_tier(context(), roots, capacity_blocks=50)
    keys = random_keys(20) + [os.urandom(300)]  # and a long key (named by a hash)
    try:
        assert store_keys(tier, keys).success
        inv = tier.inventory(ages=True)
        assert isinstance(inv, TierInventory) and inv.tier == tier.ctx.name
        assert [ns.location for ns in inv.namespaces] == roots
        assert inv.keys() == set(keys) and inv.blocks == 21
        assert all(b.size == FILE for b in inv)
        assert all(b.stored_at is not None and before - 2 <= b.stored_at <= time.time() + 2
                   for b in inv)
        for ns, r in zip(inv.namespaces, roots, strict=True):
            assert ns.namespace == tier.ctx.namespace.fingerprint
            assert ns.capacity_bytes == 50 * FILE and ns.reserved_bytes == 0
            assert ns.committed_bytes == len(ns.blocks) * FILE
            on_disk = [p for p in Path(r).rglob("*.kvb")]
            assert len(on_disk) == len(ns.blocks)
        assert inv.committed_bytes == tier.stats().usage_bytes
        assert all(b.stored_at is None for b in tier.inventory())  # ages not asked for
    finally:
        tier.close()


def test_removals_reach_the_events(tmp_path: Path) -> None:
    ctx = context(slots=16)
    ctx.events.enable()
    tier = open_tier(ctx, tmp_path, capacity_blocks=4)
    other = open_tier(context(slots=16), tmp_path, capacity_blocks=4)  # another process
    try:
        old = [os.urandom(100), *random_keys(3)]  # a long key first: evicted first
        assert store_keys(tier, old).success
        assert ctx.events.take() == []
        new = random_keys(2)
        assert store_keys(tier, new, 4).success  # evicts the two oldest
        assert sorted(ctx.events.take()) == sorted(old[:2])  # the long one read from its file
        path = Path(tier.block_path(old[2]))
        data = bytearray(path.read_bytes())
        data[5000] ^= 1
        path.write_bytes(bytes(data))
        assert not load_and_check(tier, [old[2]]).success  # corrupt: dropped
        assert ctx.events.take() == [old[2]]
        # Another process evicts two more; we learn it from the journal. (A long key
        # removed by another process could not be named: its file is gone by then.)
        assert store_keys(other, random_keys(3), 8).success
        tier.stores[0].sync()
        assert sorted(ctx.events.take()) == sorted([old[3], new[0]])
        assert tier.inventory().keys() == other.inventory().keys()
    finally:
        other.close()
        tier.close()


def test_the_contract_default_names_the_class() -> None:
    from kvtiers.contract.tier import SecondaryTier

    class Bare(SecondaryTier):
        lookup = submit_store = submit_load = get_finished_jobs = drain = close = stats = \
            None  # type: ignore[assignment]

    with pytest.raises(NotImplementedError, match="Bare"):
        Bare.inventory(object.__new__(Bare))
