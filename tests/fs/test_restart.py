"""Usage and recency survive a restart, through the snapshot and the journal, and
through a rebuild from the block files when both are gone; a dead writer's
temporary files and intents are cleaned up at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kvtiers_fs.namespace.store as store_mod
import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import random_keys, resolve_lookup
from kvtiers_fs.disk import layout

from tests.fs.child import die_half_way
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


def test_dead_writer_leftovers_are_cleaned_at_start_up(mp: Any, children: list[Any],
                                                       tmp_path: Path) -> None:
    """A real writer process is killed (SIGKILL) after reserving two blocks, one
    half written, one complete and renamed but not committed: the next start-up
    removes the temporary file, commits the complete block (verified) and aborts
    the other."""
    root = tmp_path / "root"
    root.mkdir()
    keys = random_keys(3)
    queue = mp.Queue()
    proc = mp.Process(target=die_half_way, args=(str(root), keys, BLOCK, queue), daemon=True)
    children.append(proc)
    proc.start()
    writer = queue.get(timeout=30)
    proc.kill()
    proc.join(10)
    ctx = context(BLOCK)
    assert disk_files(ns_dir(root, ctx))[2] == 1  # the half-written temporary file

    other = open_tier(ctx, root, 100)
    try:
        blocks, nbytes, tmps = disk_files(ns_dir(root, ctx))
        assert tmps == 0, "a dead writer's temporary file survived start-up"
        assert (blocks, other.stats().usage_bytes) == (2, 2 * FILE)
        inv = other.inventory()
        assert inv.keys() == {keys[0], keys[2]} and inv.reserved_blocks == 0
        assert resolve_lookup(other, keys[1]) is LookupResult.MISS
        assert resolve_lookup(other, keys[2]) is LookupResult.HIT
        assert load_and_check(other, [keys[0], keys[2]]).success
        assert not (ns_dir(root, ctx) / "writers" / f"{writer:016x}").exists()
    finally:
        other.close()


def test_a_dead_writer_whose_shard_became_a_symlink_is_still_settled(
        mp: Any, children: list[Any], tmp_path: Path) -> None:
    """Settling a dead writer meets a symlink planted as the shard of one of its
    intents: that intent is aborted, the others settled, nothing left pending - not
    an exception half way (issue 11, item 2)."""
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    keys = random_keys(3)
    queue = mp.Queue()
    proc = mp.Process(target=die_half_way, args=(str(root), keys, BLOCK, queue), daemon=True)
    children.append(proc)
    proc.start()
    queue.get(timeout=30)
    proc.kill()
    proc.join(10)
    ctx = context(BLOCK)
    shards = [ns_dir(root, ctx) / "blocks" / layout.shard_of(layout.ident(k)) for k in keys]
    if len(set(shards)) < 3:
        pytest.skip("the random keys share a shard")
    shard = shards[1]
    assert any(f.name.endswith(".tmp") for f in shard.iterdir())  # the dead writer's
    for f in shard.iterdir():
        f.unlink()
    shard.rmdir()
    shard.symlink_to(outside, target_is_directory=True)
    other = open_tier(ctx, root, 100)
    try:
        assert other.stats().usage_bytes == 2 * FILE, "the dead writer's intents stayed"
        inv = other.inventory()
        assert inv.reserved_blocks == 0 and inv.keys() == {keys[0], keys[2]}
        assert load_and_check(other, [keys[0], keys[2]]).success
        assert list(outside.iterdir()) == []
    finally:
        other.close()
