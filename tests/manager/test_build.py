"""A manager built from a real config moves real bytes through its tiers."""

from __future__ import annotations

import os

import pytest

from kvtiers.clock import ManualClock
from kvtiers.config import load_config
from kvtiers.keys import make_key
from kvtiers.lookup import LookupResult
from kvtiers.manager.build import build_manager, tier_names
from kvtiers.namespace import BlockGeometry, Namespace
from kvtiers.pool_view import PoolView

NS = Namespace("test/model", (BlockGeometry(2, 2, 64, "float16", 16),))
BLOCK = NS.groups[0].block_bytes


def _config(**extra):
    doc = {
        "cpu_bytes_to_use": 8 * 4096 * 2,
        "eviction_policy": "arc",
        "cascade_queue_blocks": 16,
        "secondary_tiers": [
            {"type": "memory", "capacity_bytes": 64 * BLOCK},
            {"type": "faulty", "inner": {"type": "memory", "capacity_bytes": 64 * BLOCK}},
        ],
        **extra,
    }
    return load_config(doc)


def test_names_number_repeated_types():
    config = _config()
    assert tier_names(config) == ["memory", "faulty"]
    doubled = load_config({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [
        {"type": "memory", "capacity_bytes": 4096}, {"type": "memory", "capacity_bytes": 8192}]})
    assert tier_names(doubled) == ["memory#1", "memory#2"]


def test_built_manager_round_trips_through_both_tiers():
    pool = PoolView.anonymous(8, BLOCK)
    clock = ManualClock()
    mgr = build_manager(_config(), pool, NS, clock=clock)
    try:
        keys = [make_key(os.urandom(32)) for _ in range(8)]
        out = mgr.prepare_store(keys)
        data = {}
        for k, slot in zip(out.keys, out.slots):
            data[k] = os.urandom(BLOCK)
            pool.block(slot)[:] = data[k]
        mgr.complete_store(out.keys)
        mgr.drain(10)
        stats = mgr.stats()["tiers"]
        assert stats["memory"]["cascaded_blocks"] == 8
        assert stats["faulty"]["cascaded_blocks"] == 8
        mgr.reset()  # the pool forgets; the tiers still hold every block
        assert mgr.lookup(keys[0]) is LookupResult.HIT_PENDING
        mgr.drain(10)
        assert mgr.lookup(keys[0]) is LookupResult.HIT
        (slot,) = mgr.prepare_load([keys[0]])
        assert bytes(pool.block(slot)) == data[keys[0]]
        mgr.complete_load([keys[0]])
        assert mgr.stats()["tiers"]["memory"]["promoted_hits"] == 1
    finally:
        mgr.close()


def test_require_verified_refuses_a_tier_that_does_not_verify():
    # The config check reads the class's flag; the manager reads the instance's.
    from kvtiers.config.loader import ConfigRejected

    with pytest.raises(ConfigRejected, match="does not verify"):
        _config(require_verified_tiers=True)
