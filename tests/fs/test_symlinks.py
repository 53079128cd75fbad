"""Symlinks planted in the tree are never followed, and nothing outside the root is
read, written or deleted through them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
from kvtiers.errors import ConfigError
from kvtiers.testing import random_keys, resolve_lookup

from tests.fs.helpers import context, load_and_check, ns_dir, open_tier, store_keys


def _outside(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    outside = tmp_path / "outside"
    outside.mkdir()
    files = {"precious.kvb": os.urandom(20480), "other": os.urandom(100)}
    for name, data in files.items():
        (outside / name).write_bytes(data)
    return outside, files


def _untouched(outside: Path, files: dict[str, bytes]) -> None:
    assert sorted(p.name for p in outside.iterdir()) == sorted(files)
    for name, data in files.items():
        assert (outside / name).read_bytes() == data


def test_symlinked_shard_directory_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside, files = _outside(tmp_path)
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(64)
    try:
        assert store_keys(tier, keys[:1]).success
        shard = Path(tier.block_path(keys[0])).parent
        for f in shard.iterdir():
            f.unlink()
        shard.rmdir()
        shard.symlink_to(outside, target_is_directory=True)  # the attack
        victims = [k for k in keys if Path(tier.block_path(k)).parent == shard]
        stored = store_keys(tier, keys[1:], 1)
        for key in victims[1:]:
            assert stored.failed.get(key) is FailureReason.IO
        loaded = load_and_check(tier, keys[:1], 0)
        assert set(loaded.failed.values()) <= {FailureReason.MISSING, FailureReason.IO}
        _untouched(outside, files)
        assert shard.is_symlink(), "the tier replaced the link (it could have been ours)"
    finally:
        tier.close()
    _untouched(outside, files)


def test_symlinked_block_file_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside, files = _outside(tmp_path)
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(2)
    try:
        assert store_keys(tier, keys).success
        path = Path(tier.block_path(keys[0]))
        path.unlink()
        path.symlink_to(outside / "precious.kvb")  # a file of the right size
        result = load_and_check(tier, keys, 4)
        assert result.failed == {keys[0]: FailureReason.CORRUPT}
        assert keys[1] in result.ok
        # The tier removed its own directory entry (the link), never the target.
        assert not path.is_symlink() and not path.exists()
        _untouched(outside, files)
    finally:
        tier.close()


def test_symlinked_namespace_and_blocks_directories_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside, files = _outside(tmp_path)
    ctx = context()
    ns = ns_dir(root, ctx)
    ns.symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError):
        open_tier(ctx, root)
    _untouched(outside, files)
    ns.unlink()
    ns.mkdir(mode=0o700)
    (ns / "blocks").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError):
        open_tier(ctx, root)
    _untouched(outside, files)


def test_root_that_is_a_symlink_is_a_config_error(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(ConfigError, match="symlink"):
        open_tier(context(), link)
    assert list(real.iterdir()) == []


def test_eviction_never_deletes_through_a_link(tmp_path: Path) -> None:
    """Fill, plant a link where an old block was, overfill: eviction removes the
    link entry at most, the file outside stays."""
    root = tmp_path / "root"
    root.mkdir()
    outside, files = _outside(tmp_path)
    ctx = context()
    tier = open_tier(ctx, root, capacity_blocks=4)
    keys = random_keys(12)
    try:
        assert store_keys(tier, keys[:4]).success
        oldest = Path(tier.block_path(keys[0]))
        oldest.unlink()
        oldest.symlink_to(outside / "precious.kvb")
        for i in range(4, 12, 4):
            assert store_keys(tier, keys[i : i + 4]).success
        _untouched(outside, files)
    finally:
        tier.close()


# -- issue 11, item 2: a symlink planted as a shard directory ---------------------


def _real_files(ns: Path) -> tuple[int, int]:
    """(block files, temporary files) in real shard directories (a symlinked shard
    is not the tier's: what is behind it is not counted)."""
    blocks = tmps = 0
    for shard in (ns / "blocks").iterdir():
        if shard.is_symlink() or not shard.is_dir():
            continue
        for f in shard.iterdir():
            blocks += f.name.endswith(".kvb")
            tmps += f.name.endswith(".tmp")
    return blocks, tmps


def _plant_shard_link(shard: Path, outside: Path) -> None:
    for f in shard.iterdir():
        f.unlink()
    shard.rmdir()
    shard.symlink_to(outside, target_is_directory=True)


def test_symlinked_shards_under_eviction_leak_nothing_and_report_only_real_stores(
        tmp_path: Path) -> None:
    """A full 12-block tier whose victims and new blocks fall into symlinked shards:
    no reservation is left behind, every block reported stored is found with its
    bytes, and the tier's count equals the files it holds - also after a restart
    and for a second tier on the root."""
    root = tmp_path / "root"
    root.mkdir()
    outside, files = _outside(tmp_path)
    ctx = context(slots=64)
    tier = open_tier(ctx, root, capacity_blocks=12)
    sibling = None
    keys = random_keys(200)
    try:
        assert store_keys(tier, keys[:12]).success
        shards = {Path(tier.block_path(k)).parent for k in keys[:12]}
        for shard in sorted(shards)[:4]:  # the shards of about a third of the blocks
            _plant_shard_link(shard, outside)
        linked = {s for s in shards if s.is_symlink()}
        sibling = open_tier(context(slots=64), root, capacity_blocks=12)
        for i in range(12, 200, 4):
            batch = keys[i : i + 4]
            tier_ = tier if i % 8 else sibling
            result = store_keys(tier_, batch)
            for key in batch:
                if Path(tier.block_path(key)).parent in linked:
                    assert result.failed.get(key) is FailureReason.IO, key.hex()
            if result.ok:  # reported stored: found, with its bytes
                assert load_and_check(tier_, result.ok, 32).ok == result.ok, "lost"
            assert _real_files(ns_dir(root, ctx))[1] == 0, "a temporary file is left"
        for t in (tier, sibling):
            inv = t.inventory()
            assert inv.reserved_blocks == 0, "a reservation leaked"
        # Every block of the first fill (some lost with the shards replaced behind the
        # tier's back) has been evicted since: the count is the files again.
        for t in (tier, sibling):
            assert t.inventory().blocks == _real_files(ns_dir(root, ctx))[0]
        _untouched(outside, files)
    finally:
        tier.close()
        if sibling is not None:
            sibling.close()
    again = open_tier(context(slots=64), root, capacity_blocks=12)
    try:
        inv = again.inventory()
        blocks, tmps = _real_files(ns_dir(root, ctx))
        assert (inv.blocks, inv.reserved_blocks, tmps) == (blocks, 0, 0)
        assert inv.committed_bytes == again.stats().usage_bytes == blocks * (4096 + 16384)
        assert load_and_check(again, sorted(inv.keys())).success
    finally:
        again.close()
    _untouched(outside, files)


def test_a_block_whose_shard_became_a_symlink_is_no_hit_for_ever(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside, files = _outside(tmp_path)
    tier = open_tier(context(), root)
    keys = random_keys(2)
    try:
        assert store_keys(tier, keys).success
        _plant_shard_link(Path(tier.block_path(keys[0])).parent, outside)
        first = load_and_check(tier, keys[:1])
        assert set(first.failed.values()) <= {FailureReason.IO, FailureReason.MISSING}
        assert first.failed, "served through a symlinked shard"
        assert resolve_lookup(tier, keys[0]) is LookupResult.MISS
        assert tier.inventory().keys() == {keys[1]} - (
            {keys[1]} if Path(tier.block_path(keys[1])).parent.is_symlink() else set())
        _untouched(outside, files)
    finally:
        tier.close()
