"""`BlockIO.read_many` (the native batch read of small blocks) gives the answers the
per-block path gives, for good files and for every kind of damage; the tier's
batched loads serve the right bytes."""

from __future__ import annotations

import os
from pathlib import Path

import kvtiers_fs.disk.blockio as blockio
import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.testing import random_keys
from kvtiers_fs.disk import layout
from kvtiers_fs.disk.blockio import ReadOutcome

from tests.fs.helpers import BB, block_data, context, load_and_check, open_tier, store_keys

pytestmark = pytest.mark.skipif(blockio._readmany is None or not layout.has_openat2(),
                                reason="kvtiers_fs.disk._readmany was not built, or no openat2")


def _damage(tier: object, keys: list[bytes]) -> dict[bytes, str]:
    """Damage the files of keys[1:] in one way each; keys[0] stays good."""
    paths = [Path(tier.block_path(k)) for k in keys]  # type: ignore[attr-defined]
    kinds = {}
    paths[1].unlink()
    kinds[keys[1]] = "missing"
    with open(paths[2], "r+b") as f:  # a bit flip in the block
        f.seek(4096 + 100)
        b = f.read(1)
        f.seek(4096 + 100)
        f.write(bytes([b[0] ^ 1]))
    kinds[keys[2]] = "bit flip"
    os.truncate(paths[3], 4096 + BB // 2)
    kinds[keys[3]] = "truncated"
    with open(paths[4], "r+b") as f:  # the header's checksum no longer matches
        f.seek(60)
        f.write(b"\xff\xff")
    kinds[keys[4]] = "header"
    paths[5].unlink()
    os.symlink(paths[0], paths[5])
    kinds[keys[5]] = "symlink"
    paths[6].unlink()
    os.mkfifo(paths[6], 0o600)
    kinds[keys[6]] = "fifo"
    with open(paths[7], "ab") as f:  # a longer file than a block file
        f.write(b"x" * 4096)
    kinds[keys[7]] = "too long"
    return kinds


@pytest.mark.parametrize("o_direct", [True, False], ids=["o_direct", "buffered"])
def test_read_many_answers_as_the_per_block_path(tmp_path: Path, o_direct: bool) -> None:
    ctx = context(slots=32)
    tier = open_tier(ctx, tmp_path, o_direct="auto" if o_direct else False)
    try:
        keys = random_keys(8)
        assert store_keys(tier, keys).success
        kinds = _damage(tier, keys)
        io, store = tier._io[0], tier.stores[0]
        items = [(layout.ident(k), k, ctx.pool.block(16 + i)) for i, k in enumerate(keys)]
        native = io.read_many(store.blocks_fd, items)
        assert native[0] is not None and native[0].outcome is ReadOutcome.OK
        assert bytes(ctx.pool.block(16)) == block_data(keys[0])
        for (idn, key, block), got in zip(items, native, strict=True):
            one = io.read_beneath(store.blocks_fd, idn, key, block)
            if one is None:  # the per-block path's own fallback decides
                shard = store.shard_fd(idn, create=False)
                try:
                    one = io.read(shard, idn, key, block)
                finally:
                    os.close(shard)
            if got is None:  # left to the per-block path: an error it classifies
                assert kinds.get(key) in ("symlink", "fifo"), (kinds.get(key), one)
                continue
            assert got.outcome is one.outcome, (kinds.get(key, "good"), got, one)
        assert [g.outcome for g in native if g is not None][1:4] == [
            ReadOutcome.MISSING, ReadOutcome.CORRUPT, ReadOutcome.CORRUPT]
    finally:
        tier.close()


def test_batched_loads_serve_the_right_bytes_and_fail_damaged_blocks(tmp_path: Path) -> None:
    ctx = context(slots=64)
    tier = open_tier(ctx, tmp_path)
    try:
        keys = random_keys(40)  # one job: batches of 1 MiB of 16 KiB blocks
        assert store_keys(tier, keys).success
        Path(tier.block_path(keys[3])).unlink()
        with open(tier.block_path(keys[30]), "r+b") as f:  # flip one bit
            f.seek(4096 + 7)
            b = f.read(1)
            f.seek(4096 + 7)
            f.write(bytes([b[0] ^ 1]))
        result = load_and_check(tier, keys)  # checks the bytes of every block served
        assert result.failed == {keys[3]: FailureReason.MISSING,
                                 keys[30]: FailureReason.CORRUPT}
        assert len(result.ok) == 38
    finally:
        tier.close()
