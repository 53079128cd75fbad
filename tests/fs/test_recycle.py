"""Recycling: a full tier writes each new block into the file of the block it
evicted (renamed to the new block's temporary name, overwritten whole, renamed into
place) - and a reader that had the evicted file open never mistakes the new bytes
for corruption."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.keys import make_key
from kvtiers_fs.disk import layout
from kvtiers_fs.disk.blockio import ReadOutcome
from kvtiers_fs.namespace.write_verdict import WriteVerdict

from tests.fs.helpers import (
    FILE,
    context,
    disk_files,
    load_and_check,
    ns_dir,
    open_tier,
    store_keys,
)


def _keys(n: int) -> list[bytes]:
    return [make_key(os.urandom(32)) for _ in range(n)]


def _inodes(root: Path, tier: object) -> set[int]:
    blocks = ns_dir(root, tier) / "blocks"
    return {e.stat(follow_symlinks=False).st_ino for d in blocks.iterdir()
            for e in os.scandir(d) if e.name.endswith(".kvb")}


@pytest.mark.parametrize("options", [{}, {"o_direct": False}, {"durable": True}],
                         ids=["o_direct-auto", "buffered", "durable"])
def test_a_full_tier_reuses_evicted_files(tmp_path: Path, options: dict[str, object]) -> None:
    ctx = context(slots=16)
    tier = open_tier(ctx, tmp_path, capacity_blocks=8, **options)
    try:
        old = _keys(8)
        assert store_keys(tier, old).success
        first_inodes = _inodes(tmp_path, tier)
        new = _keys(8)
        assert store_keys(tier, new, first_slot=8).success
        store = tier.stores[0]
        assert store.evictions == 8 and store.recycled == 8
        # the same files, holding other blocks now
        assert _inodes(tmp_path, tier) == first_inodes
        assert sorted(load_and_check(tier, new, first_slot=8).ok) == sorted(new)
        assert load_and_check(tier, old).failed == {k: FailureReason.MISSING for k in old}
        assert disk_files(ns_dir(tmp_path, tier)) == (8, 8 * FILE, 0)
        assert tier.stats().usage_bytes == 8 * FILE
    finally:
        tier.close()
    again = open_tier(context(slots=16), tmp_path, capacity_blocks=8, **options)
    try:
        assert sorted(load_and_check(again, new, first_slot=8).ok) == sorted(new)
    finally:
        again.close()


def test_an_aborted_recycled_store_leaves_no_file(tmp_path: Path) -> None:
    ctx = context(slots=8)
    tier = open_tier(ctx, tmp_path, capacity_blocks=2)
    try:
        assert store_keys(tier, _keys(2)).success
        store = tier.stores[0]
        idn = layout.ident(make_key(os.urandom(32)))
        verdicts, evicted = store.reserve([(idn, FILE)])
        assert verdicts == [WriteVerdict.RECYCLED] and evicted == 1
        shard = store.shard_fd(idn, create=False)
        try:
            tmp = layout.tmp_name(idn, store.writer)
            os.stat(tmp, dir_fd=shard)  # the evicted file waits there
            store.commit([], [idn])  # the store never ran (deadline, close)
            assert not os.path.exists(f"/proc/self/fd/{shard}/{tmp}")
        finally:
            os.close(shard)
        assert disk_files(ns_dir(tmp_path, tier)) == (1, FILE, 0)
        assert tier.stats().usage_bytes == FILE
    finally:
        tier.close()


def test_a_reader_of_a_recycled_file_sees_a_miss_not_corruption(tmp_path: Path) -> None:
    """Another process evicts a block while we read it and writes a new block into
    the same file: the read must be MISSING (no corrupt count, nothing deleted)."""
    writer_tier = open_tier(context(slots=8), tmp_path, capacity_blocks=2)
    reader_tier = open_tier(context(slots=8), tmp_path, capacity_blocks=2)
    try:
        victim, other = _keys(2)
        assert store_keys(writer_tier, [victim, other]).success
        idn = layout.ident(victim)
        store = reader_tier.stores[0]
        path = layout.block_relpath(idn)
        fd = os.open(path, os.O_RDONLY, dir_fd=store.blocks_fd)  # the read begins
        newer = _keys(1)
        assert store_keys(writer_tier, newer, first_slot=2).success
        assert writer_tier.stores[0].recycled == 1
        assert reader_tier._io[0]._read_fd(fd, victim, reader_tier.ctx.pool.block(5),
                                           store.blocks_fd, path).outcome \
            is ReadOutcome.MISSING
        # ... while a file that is still at its name and fails verification is corrupt
        oidn = layout.ident(other)
        opath = layout.block_relpath(oidn)
        fd = os.open(opath, os.O_RDWR, dir_fd=store.blocks_fd)
        at = layout.HEADER_BYTES + 7
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0xFF]), at)  # (a byte flipped)
        os.lseek(fd, 0, os.SEEK_SET)
        assert reader_tier._io[0]._read_fd(fd, other, reader_tier.ctx.pool.block(5),
                                           store.blocks_fd, opath).outcome \
            is ReadOutcome.CORRUPT
        assert load_and_check(writer_tier, newer, first_slot=2).ok == newer
        assert load_and_check(reader_tier, [victim], first_slot=6).failed == \
            {victim: FailureReason.MISSING}
    finally:
        reader_tier.close()
        writer_tier.close()
