"""Snapshots of the CPU pool (`kvtiers.ops.pool_snapshot`, `kvtiers bench
--snapshot-save/--snapshot-load`) and "hottest" as the order of use, for the pool
and for the fs tier: random bytes, every block checked, a real manager and pool,
real fs roots, real bench processes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from kvtiers.config import load_config
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.manager.build import build_manager
from kvtiers.testing import make_namespace, random_keys

from tests.bench.conftest import BLOCK as BENCH_BLOCK
from tests.bench.conftest import TINY
from tests.fs.helpers import (
    FILE,
    block_data,
    context,
    load_and_check,
    open_tier,
    store_keys,
)

from .conftest import fs_config, kvtiers

pytest.importorskip("zarr")
from kvtiers.ops.pool_snapshot import load_pool, save_pool
from kvtiers.ops.snapshot_store import SnapshotError, SnapshotReader

BB = 16384  # the fs helpers' block and namespace (`context(model="model-a")`)
NS = make_namespace("model-a", BB)


def _stack(slots: int, tiers: list[dict[str, Any]] | None = None) -> tuple[Any, PoolView]:
    pool = PoolView.anonymous(slots, BB)
    config = load_config({"cpu_bytes_to_use": pool.nbytes, "secondary_tiers": tiers or []})
    return build_manager(config, pool, NS), pool


def _store(mgr: Any, pool: PoolView, keys: list[bytes]) -> dict[bytes, bytes]:
    content = {k: block_data(k, BB) for k in keys}  # random, and known to load_and_check
    out = mgr.prepare_store(keys)
    assert out is not None and list(out.keys) == keys
    for k, slot in zip(keys, out.slots, strict=True):
        pool.block(slot)[:] = content[k]
    mgr.complete_store(keys)
    return content


def _saved(url: str) -> list[bytes]:
    return [k for chunk in SnapshotReader(url).chunks() for k, _, _ in chunk]


def test_the_pools_hottest_blocks_by_use_into_a_fresh_pool(tmp_path: Path) -> None:
    mgr, pool = _stack(128)
    keys = random_keys(100)
    try:
        content = _store(mgr, pool, keys[:50])
        content |= _store(mgr, pool, keys[50:])
        used = keys[:10]  # stored first, used since: the hottest, by LRU
        mgr.touch(used)
        url = str(tmp_path / "pool.zarr")
        result = save_pool(mgr, pool, NS, url)
        assert result.blocks == 100 and result.hottest_by == "recency"
        order = _saved(url)
        assert order == used[::-1] + keys[10:][::-1]  # most recently used first
        result = save_pool(mgr, pool, NS, str(tmp_path / "hot.zarr"), hottest=10)
        assert result.blocks == 10 and set(_saved(str(tmp_path / "hot.zarr"))) == set(used)
        reader = SnapshotReader(url)
        assert reader.attrs["source"] == "cpu" and reader.namespace == NS
    finally:
        mgr.close()
    # a fresh stack: every block byte-equal and a hit
    fresh, fpool = _stack(128)
    try:
        result = load_pool(fresh, fpool, NS, SnapshotReader(url))
        assert result.blocks == 100 and result.bad == [] and result.failed == {}
        # loaded coldest first: the pool's order of use is the snapshot's
        assert [k for k, _ in fresh.resident_blocks()][::-1] == order
        assert [fresh.lookup(k) for k in keys] == [LookupResult.HIT] * 100
        slots = fresh.prepare_load(keys)
        for k, slot in zip(keys, slots, strict=True):
            assert bytes(fpool.block(slot)) == content[k]
        fresh.complete_load(keys)
    finally:
        fresh.close()
    # a smaller pool keeps the hottest
    small, spool = _stack(16)
    try:
        assert load_pool(small, spool, NS, SnapshotReader(url)).blocks == 16
        assert {k for k, _ in small.resident_blocks()} == set(order[:16])
        for k in order[:16]:
            (slot,) = small.prepare_load([k])
            assert bytes(spool.block(slot)) == content[k]
            small.complete_load([k])
    finally:
        small.close()


def test_another_namespace_or_a_damaged_block_is_refused(tmp_path: Path) -> None:
    mgr, pool = _stack(32)
    keys = random_keys(6)
    try:
        _store(mgr, pool, keys)
        url = tmp_path / "pool.zarr"
        save_pool(mgr, pool, NS, str(url))
    finally:
        mgr.close()
    other = Namespace("model-b", NS.groups)
    assert other.groups == (BlockGeometry(1, 1, BB // 2, "uint8", 1),)
    fresh, fpool = _stack(32)
    try:
        with pytest.raises(SnapshotError, match="model-a.*model-b"):
            load_pool(fresh, fpool, other, SnapshotReader(str(url)))
        assert fresh.resident_blocks() == []
        order = _saved(str(url))
        (chunk,) = [p for p in (url / "blocks" / "c").rglob("*") if p.is_file()]
        data = bytearray(chunk.read_bytes())
        data[3 * BB + 7] ^= 0x10  # the fourth block
        chunk.write_bytes(bytes(data))
        result = load_pool(fresh, fpool, NS, SnapshotReader(str(url)))
        assert result.bad == [order[3].hex()] and result.blocks == 5
        assert fresh.lookup(order[3]) is LookupResult.MISS
    finally:
        fresh.close()


def test_a_pool_snapshot_loads_into_an_fs_tier_and_write_through_copies_down(
        tmp_path: Path) -> None:
    root = tmp_path / "fs"
    root.mkdir()
    mgr, pool = _stack(64)
    keys = random_keys(20)
    try:
        _store(mgr, pool, keys)
        url = str(tmp_path / "pool.zarr")
        save_pool(mgr, pool, NS, url)
    finally:
        mgr.close()
    (tmp_path / "b").mkdir()
    done = kvtiers("snapshot", "load", fs_config(tmp_path / "b.json", str(tmp_path / "b"),
                                                 200 * FILE), url, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["blocks"] == 20
    # into a pool over an fs tier: write_through copies every block down
    fresh, fpool = _stack(64, [{"type": "fs", "root_dir": str(root),
                                "capacity_bytes": 200 * FILE}])
    try:
        assert load_pool(fresh, fpool, NS, SnapshotReader(url)).blocks == 20
        assert fresh.drain(60)
    finally:
        fresh.close()
    for where in (tmp_path / "b", root):
        tier = open_tier(context(model="model-a"), where, 200)
        try:
            assert [tier.lookup(k) for k in keys] == [LookupResult.HIT] * 20
            assert not load_and_check(tier, keys).failed  # byte for byte (block_data)
        finally:
            tier.close()


def test_the_fs_tiers_hottest_are_its_most_recently_used(tmp_path: Path) -> None:
    """A block stored early and used since is hotter than newer ones: `--hottest`
    keeps it (newest-by-store-time would not), and saving leaves the order as it
    was."""
    root = tmp_path / "a"
    root.mkdir()
    old, new = random_keys(8), random_keys(8)
    tier = open_tier(context(model="model-a", slots=64), root, 200)
    try:
        assert store_keys(tier, old).success
        time.sleep(0.05)
        assert store_keys(tier, new).success
        tier.touch(old[:4])
    finally:
        tier.close()
    cfg = fs_config(tmp_path / "a.json", str(root), 200 * FILE)
    for name in ("hot", "again"):
        url = str(tmp_path / f"{name}.zarr")
        done = kvtiers("snapshot", "save", cfg, url, "--hottest", "4", "--json")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["blocks"] == 4 and doc["hottest_by"] == "recency"
        assert _saved(url) == old[:4][::-1]
    done = kvtiers("snapshot", "save", cfg, str(tmp_path / "all.zarr"))
    assert done.returncode == 0 and "most recently used first" in done.stdout, done.stderr
    assert _saved(str(tmp_path / "all.zarr")) == old[:4][::-1] + new[::-1] + old[4:][::-1]


def test_the_cli_says_where_a_pool_snapshot_is_taken(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    cfg = fs_config(tmp_path / "a.json", str(tmp_path / "a"), 200 * FILE)
    for action in ("save", "load"):
        done = kvtiers("snapshot", action, cfg, str(tmp_path / "s.zarr"), "--tier", "cpu")
        assert done.returncode == 2, done.stderr
        assert f"kvtiers bench --snapshot-{action}" in done.stderr
        assert "Traceback" not in done.stderr
        done = kvtiers("snapshot", action, "--help")
        assert done.returncode == 0 and "--storage-option" in done.stdout
    done = kvtiers("snapshot", "save", cfg, str(tmp_path / "s.zarr"),
                   "--storage-option", "novalue")
    assert done.returncode == 2 and "KEY=VALUE" in done.stderr


def test_bench_saves_its_pool_and_a_fresh_bench_starts_warm(tmp_path: Path) -> None:
    """Run 1 saves its pool; run 2 (same seed) pre-warms from it: fewer tokens
    recomputed, every block loaded back verified by the bench (exit 0)."""
    pytest.importorskip("torch")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 1024 * BENCH_BLOCK}))
    url = str(tmp_path / "bench-pool.zarr")
    out1, out2 = tmp_path / "1.json", tmp_path / "2.json"
    done = kvtiers("bench", "--config", str(config), *TINY, "--snapshot-save", url,
                   "--json", str(out1), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(out1.read_text())
    saved = first["snapshot"]["save"]["blocks"]
    assert saved == first["result"]["manager"]["pool"]["resident"] > 0
    done = kvtiers("bench", "--config", str(config), *TINY, "--snapshot-load", url,
                   "--json", str(out2), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    second = json.loads(out2.read_text())
    assert second["snapshot"]["load"]["blocks"] == saved
    assert second["snapshot"]["load"]["bad"] == []
    r1, r2 = first["result"], second["result"]
    assert r2["recomputed_tokens"] < r1["recomputed_tokens"]
    assert r2["verified"]["blocks"] > r1["verified"]["blocks"]
    # another geometry's snapshot is refused before the run
    done = kvtiers("bench", "--config", str(config), *TINY, "--block-tokens", "32",
                   "--snapshot-load", url, timeout=300)
    assert done.returncode == 2 and "refusing to load" in done.stderr, done.stderr[-3000:]


def test_a_tier_without_an_order_gives_its_newest_first(tmp_path: Path) -> None:
    """A tier whose inventory has no eviction order (`eviction_order` False, as a
    third-party tier's default): newest by `stored_at` stands for hottest."""
    import dataclasses

    from kvtiers.contract.inventory import TierInventory
    from kvtiers.ops.snapshot import hottest_first

    root = tmp_path / "a"
    root.mkdir()
    old, new = random_keys(5), random_keys(5)
    tier = open_tier(context(model="model-a", slots=64), root, 200)
    try:
        assert store_keys(tier, old).success
        time.sleep(0.05)  # file times tell them apart
        assert store_keys(tier, new).success
        tier.touch(old)  # the hottest by use, but not the newest
        ordered, by = hottest_first(tier)
        assert by == "recency" and set(ordered[:5]) == set(old)
        real = tier.inventory

        def unordered(*, ages: bool = False) -> TierInventory:
            inv = real(ages=ages)
            return dataclasses.replace(inv, namespaces=tuple(
                dataclasses.replace(ns, eviction_order=False) for ns in inv.namespaces))

        tier.inventory = unordered  # type: ignore[method-assign]
        ordered, by = hottest_first(tier)
        assert by == "stored_at" and set(ordered[:5]) == set(new)
    finally:
        tier.close()


def test_bench_refuses_a_save_target_of_user_files_before_the_run(tmp_path: Path) -> None:
    """--snapshot-save to a directory of other files: exit 2 before the run, the files
    intact; to the snapshot of an earlier run: only with --snapshot-overwrite (or
    when --snapshot-load names it)."""
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 1024 * BENCH_BLOCK}))
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "a.txt").write_text("a\n")
    out = tmp_path / "out.json"
    done = kvtiers("bench", "--config", str(config), *TINY, "--snapshot-save", str(victim),
                   "--snapshot-overwrite", "--json", str(out), timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert str(victim) in done.stderr and "(sub)" in done.stderr, done.stderr[-3000:]
    assert (victim / "sub" / "a.txt").read_text() == "a\n" and os.listdir(victim) == ["sub"]
    assert not out.exists()  # refused before the run
    snap = tmp_path / "pool.zarr"
    mgr, pool = _stack(8)
    try:
        save_pool(mgr, pool, NS, str(snap))  # an empty pool's snapshot: a kvtiers one
    finally:
        mgr.close()
    done = kvtiers("bench", "--config", str(config), *TINY, "--snapshot-save", str(snap),
                   timeout=300)
    assert done.returncode == 2 and "--snapshot-overwrite" in done.stderr, done.stderr[-3000:]
