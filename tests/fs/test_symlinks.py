"""Symlinks planted in the tree are never followed, and nothing outside the root is
read, written or deleted through them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtiers.errors import ConfigError
from kvtiers.jobs import FailureReason
from kvtiers.testing import random_keys

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
