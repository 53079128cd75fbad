"""A manager built from a real config moves real bytes through its tiers."""

from __future__ import annotations

import os

import pytest
from kvtiers.config import load_config
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.keys import make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.manager.build import build_manager, tier_names

NS = Namespace("test/model", (BlockGeometry(2, 2, 64, "float16", 16),))
BLOCK = NS.groups[0].block_bytes


def _config(**extra):
    doc = {
        "cpu_bytes_to_use": 8 * BLOCK,  # the 8-slot pool of the tests
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
        for k, slot in zip(out.keys, out.slots, strict=True):
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


def test_without_tiers_no_pool_view_nor_namespace_is_needed():
    config = load_config({"cpu_bytes_to_use": 10 * BLOCK + 100, "eviction_policy": "sieve"})
    mgr = build_manager(config, block_bytes=BLOCK)
    try:
        assert mgr.num_slots == 10  # what CpuPool(BLOCK, cpu_bytes_to_use) would hold
        keys = [make_key(os.urandom(32)) for _ in range(12)]
        out = mgr.prepare_store(keys)
        assert out is None  # 12 blocks cannot fit in 10 slots
        out = mgr.prepare_store(keys[:10])
        assert len(set(out.slots)) == 10 and max(out.slots) == 9
    finally:
        mgr.close()


def test_block_bytes_count_in_whole_slots():
    config = load_config({"cpu_bytes_to_use": 3 * 8192})
    mgr = build_manager(config, block_bytes=4096 + 1)  # slots of 8 KiB
    assert mgr.num_slots == 3
    with pytest.raises(TypeError, match="block_bytes"):
        build_manager(config)


def test_tiers_need_the_pool_and_a_namespace():
    with pytest.raises(TypeError, match="the pool's view and a namespace"):
        build_manager(_config(), block_bytes=BLOCK)
    with pytest.raises(TypeError, match="a namespace"):
        build_manager(_config(), PoolView.anonymous(8, BLOCK))


def test_a_pool_that_disagrees_with_cpu_bytes_to_use_is_refused_naming_both():
    from kvtiers.errors import ConfigError

    for slots in (4, 9):
        with pytest.raises(ConfigError) as info:
            build_manager(_config(), PoolView.anonymous(slots, BLOCK), NS)
        message = str(info.value)
        assert f"cpu_bytes_to_use is {8 * BLOCK} bytes" in message and "makes 8 slots" in message
        assert f"has {slots} slots ({slots * BLOCK} bytes" in message
        assert message.startswith("$.cpu_bytes_to_use:")


def test_events_follow_the_config_unless_overridden():
    pool = PoolView.anonymous(8, BLOCK)
    for doc, override, expected in (
        ({}, None, False), ({"enable_kv_events": True}, None, True),
        ({"enable_kv_events": True}, False, False), ({}, True, True),
    ):  # fmt: skip
        mgr = build_manager(_config(**doc), pool, NS, enable_events=override)
        try:
            assert mgr.events_enabled is expected
            out = mgr.prepare_store([make_key(os.urandom(32))])
            mgr.complete_store(out.keys)
            mgr.drain(10)
            kinds = [(e.kind, e.tier) for e in mgr.take_events()]
            assert kinds == ([("stored", "cpu"), ("stored", "memory"), ("stored", "faulty")]
                             if expected else [])
        finally:
            mgr.close()
