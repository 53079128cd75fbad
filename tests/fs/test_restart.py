"""Usage and recency survive a restart, through the snapshot and the journal, and
through a rebuild from the block files when both are gone; a dead writer's
temporary files and intents are cleaned up at start-up."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from kvtiers.lookup import LookupResult
from kvtiers.testing import random_keys, resolve_lookup

import kvtiers_fs.store as store_mod
from kvtiers_fs import layout
from tests.fs.helpers import context, disk_files, load_and_check, ns_dir, open_tier, store_keys

N = 20_000
BLOCK = 4096
FILE = 4096 + BLOCK


def _fill(root: Path, n: int, capacity: int) -> list[bytes]:
    ctx = context(BLOCK, slots=500)
    tier = open_tier(ctx, root, capacity, threads={"load": 2, "store": 2})
    keys = random_keys(n)
    try:
        for i in range(0, n, 500):
            result = store_keys(tier, keys[i : i + 500])
            assert result.success, result.failed
        tier.touch(keys[:100])  # the oldest hundred become the most recent
    finally:
        tier.close()
    return keys


def test_twenty_thousand_blocks_keep_usage_and_recency(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "ROTATE_MIN_BYTES", 256 << 10)  # several generations
    root = tmp_path / "root"
    root.mkdir()
    keys = _fill(root, N, N)
    ctx = context(BLOCK, slots=500)
    tier = open_tier(ctx, root, N)
    try:
        assert tier.stats().usage_bytes == N * FILE == disk_files(ns_dir(root, ctx))[1]
        assert load_and_check(tier, keys[-50:]).success
        # Full: 100 new blocks evict the 100 least recent - not the touched ones.
        new = random_keys(100)
        assert store_keys(tier, new).success
        assert tier.stats().evictions == 100
        assert all(resolve_lookup(tier, k) is LookupResult.HIT for k in keys[:100])
        assert all(resolve_lookup(tier, k) is LookupResult.MISS for k in keys[100:200])
        assert all(resolve_lookup(tier, k) is LookupResult.HIT for k in keys[200:210])
    finally:
        tier.close()


def test_rebuild_from_block_files_when_the_index_is_gone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    keys = _fill(root, 1000, 1000)
    ctx = context(BLOCK, slots=500)
    ns = ns_dir(root, ctx)
    for f in [*ns.glob("snapshot.*"), *ns.glob("journal.*")]:
        f.unlink()
    tier = open_tier(ctx, root, 1000)
    try:
        assert tier.stats().usage_bytes == 1000 * FILE
        assert load_and_check(tier, keys[::50]).success
    finally:
        tier.close()


def test_damaged_journal_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    ctx = context(BLOCK, slots=500)
    tier = open_tier(ctx, root, 1000)
    keys = random_keys(300)
    try:
        for i in range(0, 300, 100):
            assert store_keys(tier, keys[i : i + 100]).success
    finally:
        tier.close()
    journal = max(ns_dir(root, ctx).glob("journal.*"), key=lambda p: int(p.suffix[1:]))
    data = bytearray(journal.read_bytes())
    assert len(data) > 200
    data[100] ^= 0xFF  # inside the first frame, with more frames after it
    journal.write_bytes(bytes(data))
    tier = open_tier(context(BLOCK, slots=500), root, 1000)
    try:
        assert tier.stats().usage_bytes == 300 * FILE
        assert load_and_check(tier, keys[:100]).success
    finally:
        tier.close()


def test_dead_writer_leftovers_are_cleaned_at_start_up(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    ctx = context(BLOCK)
    tier = open_tier(ctx, root, 100)
    keys = random_keys(3)
    assert store_keys(tier, keys[:1]).success
    store = tier.stores[0]
    # A writer dies after reserving two blocks: one half written, one renamed.
    idns = [layout.ident(k) for k in keys[1:]]
    verdicts, _ = store.reserve([(i, FILE) for i in idns])
    shard = store.shard_fd(idns[0], create=True)
    fd = os.open(layout.tmp_name(idns[0], store.writer), os.O_WRONLY | os.O_CREAT, 0o600,
                 dir_fd=shard)
    os.write(fd, os.urandom(1000))
    os.close(fd)
    os.close(shard)
    tier.ctx.pool.block(0)[:] = os.urandom(BLOCK)
    shard = store.shard_fd(idns[1], create=True)
    tier._io[0].write(shard, idns[1], keys[2], store.writer, tier.ctx.pool.block(0))
    os.close(shard)
    fcntl.flock(store._me_fd, fcntl.LOCK_UN)  # ... and the kernel drops its lock
    for f in (store._jfd, store._lock_fd):
        os.close(f)
    store._jfd = store._lock_fd = -1
    tier._pool.close()
    tier._probe.close()

    other = open_tier(context(BLOCK), root, 100)
    try:
        blocks, nbytes, tmps = disk_files(ns_dir(root, ctx))
        assert tmps == 0, "a dead writer's temporary file survived start-up"
        assert (blocks, other.stats().usage_bytes) == (2, 2 * FILE)
        assert resolve_lookup(other, keys[1]) is LookupResult.MISS
        assert resolve_lookup(other, keys[2]) is LookupResult.HIT
        assert not (ns_dir(root, ctx) / "writers" / f"{store.writer:016x}").exists()
    finally:
        other.close()
