"""The block file format and what a load accepts: checksums, truncation, foreign
headers, file modes, long keys."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.keys import make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.sdk.integrity import checksum
from kvtiers.testing import random_keys, resolve_lookup
from kvtiers_fs.disk import layout

from tests.fs.helpers import (
    BB,
    FILE,
    context,
    intact_header,
    load_and_check,
    ns_dir,
    open_tier,
    store_keys,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root").mkdir()
    return tmp_path / "root"


def test_header_round_trip_and_checks() -> None:
    key = make_key(os.urandom(32), 3)
    raw = layout.pack_header(key, "a" * 32, 12345, 0xDEADBEEF)
    h = layout.parse_header(raw)
    assert (h.key, h.namespace, h.block_bytes, h.checksum) == (key, "a" * 32, 12345, 0xDEADBEEF)
    damaged = bytearray(raw)
    damaged[20] ^= 1
    with pytest.raises(layout.HeaderError) as err:
        layout.parse_header(bytes(damaged))
    assert not err.value.foreign
    # An intact header of another layout version is foreign ...
    other = intact_header(key, "a" * 32, 12345, 0xDEADBEEF, layout.LAYOUT_VERSION + 1)
    with pytest.raises(layout.HeaderError) as err:
        layout.parse_header(other)
    assert err.value.foreign
    # ... but a flipped bit in the version field is damage: the header's own checksum
    # is checked before its version (issue 11, item 3).
    flipped = bytearray(raw)
    flipped[8] ^= 1
    with pytest.raises(layout.HeaderError) as err:
        layout.parse_header(bytes(flipped))
    assert not err.value.foreign


def test_files_are_aligned_private_and_complete(root: Path) -> None:
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(5)
    try:
        assert store_keys(tier, keys).success
        ns = ns_dir(root, ctx)
        assert stat.S_IMODE(ns.stat().st_mode) == 0o700
        for d in ns.rglob("*"):
            mode = stat.S_IMODE(d.lstat().st_mode)
            assert mode == (0o700 if d.is_dir() else 0o600), f"{d}: {oct(mode)}"
        for key in keys:
            path = Path(tier.block_path(key))
            assert path.stat().st_size == FILE  # header page + block, 4 KiB multiple
            h = layout.parse_header(path.read_bytes()[:4096])
            assert h.key == key and h.block_bytes == BB
    finally:
        tier.close()


@pytest.mark.parametrize("damage", ["flip_data", "flip_header", "truncate", "empty", "extend"])
def test_damaged_files_are_corrupt_misses_removed_and_counted(root: Path, damage: str) -> None:
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(3)
    try:
        assert store_keys(tier, keys).success
        path = Path(tier.block_path(keys[1]))
        data = bytearray(path.read_bytes())
        if damage == "flip_data":
            data[4096 + 777] ^= 0x40
        elif damage == "flip_header":
            data[40] ^= 0x01
        elif damage == "truncate":
            data = data[: len(data) - 4096]
        elif damage == "empty":
            data = bytearray()
        else:
            data += os.urandom(4096)
        path.write_bytes(bytes(data))
        result = load_and_check(tier, keys)
        assert result.failed == {keys[1]: FailureReason.CORRUPT}
        assert not path.exists(), "a corrupt copy was kept"
        assert resolve_lookup(tier, keys[1]) is LookupResult.MISS
        stats = tier.stats()
        assert stats.errors.get("corrupt", 0) == 1
        assert stats.usage_bytes == 2 * FILE
    finally:
        tier.close()


def test_a_header_of_another_namespace_or_version_is_never_data(root: Path) -> None:
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(2)
    try:
        assert store_keys(tier, keys).success
        for key, patch in zip(keys, ("namespace", "version"), strict=True):
            path = Path(tier.block_path(key))
            data = bytearray(path.read_bytes())
            # Well-formed headers (their own checksum right) with a correct checksum
            # of the very same block bytes: of another namespace, of another layout
            # version (intact: checksummed as such). Still not ours.
            digest = checksum(bytes(data[4096:4096 + BB]))
            if patch == "namespace":
                body = layout.pack_header(key, "f" * 32, BB, digest)
            else:
                body = intact_header(key, ctx.namespace.fingerprint, BB, digest,
                                     layout.LAYOUT_VERSION + 7)
            data[: len(body)] = body
            path.write_bytes(bytes(data))
        before = {k: Path(tier.block_path(k)).read_bytes() for k in keys}
        result = load_and_check(tier, keys)
        assert result.failed == {k: FailureReason.MISSING for k in keys}, result
        for key in keys:  # not ours to delete
            assert Path(tier.block_path(key)).read_bytes() == before[key]
        assert [resolve_lookup(tier, k) for k in keys] == [LookupResult.MISS] * 2
    finally:
        tier.close()


def test_long_keys_are_stored_under_a_hash_and_checked(root: Path) -> None:
    ctx = context()
    tier = open_tier(ctx, root)
    keys = [os.urandom(300), os.urandom(41)]
    try:
        assert store_keys(tier, keys).success
        assert load_and_check(tier, keys).success
        assert all(len(Path(tier.block_path(k)).name) < 100 for k in keys)
    finally:
        tier.close()


def test_unaligned_block_sizes_round_trip_without_touching_slot_padding(root: Path) -> None:
    bb = 3 * 4096 + 1000
    ctx = context(bb, slots=8)
    tier = open_tier(ctx, root)
    keys = random_keys(3)
    try:
        assert store_keys(tier, keys).success
        pool = ctx.pool
        pads = {}
        for slot in range(4, 7):
            start = slot * pool.slot_bytes
            pool.buffer[start + bb : start + pool.slot_bytes] = os.urandom(pool.slot_bytes - bb)
            pads[slot] = bytes(pool.buffer[start + bb : start + pool.slot_bytes])
        result = load_and_check(tier, keys, first_slot=4)
        assert result.success
        for slot, pad in pads.items():
            start = slot * pool.slot_bytes
            assert bytes(pool.buffer[start + bb : start + pool.slot_bytes]) == pad
    finally:
        tier.close()
