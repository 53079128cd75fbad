"""A damaged or foreign file under a key's name never poisons the key (issue 11,
item 3): a load never serves it, and the next store of the key writes a verified
copy in its place - reported stored only then - across restarts too."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
from kvtiers.sdk.integrity import checksum
from kvtiers.testing import random_keys, resolve_lookup
from kvtiers_fs.disk import layout

from tests.fs.helpers import (
    BB,
    FILE,
    block_data,
    context,
    intact_header,
    load_and_check,
    ns_dir,
    open_tier,
    store_keys,
)

KINDS = ["version_bit", "header_bit", "other_namespace", "other_layout_version",
         "other_key", "random_bytes"]


def _foreign(kind: str, key: bytes, good: bytes, tmp_path: Path) -> bytes:
    """What lands at `key`'s file name instead of `good` (its valid file)."""
    data = bytearray(good)
    rng = random.Random(kind)
    other = rng.randbytes(BB)  # never what block_data(key) is
    if kind == "version_bit":  # one flipped bit in the layout version field
        data[8] ^= 1
    elif kind == "header_bit":
        data[rng.randrange(16, 80)] ^= 1 << rng.randrange(8)
    elif kind == "other_namespace":  # another model's block of the same key, copied
        ctx_b = context(model="model-b")
        tier_b = open_tier(ctx_b, tmp_path / "b")
        try:
            ctx_b.pool.block(0)[:] = other
            from kvtiers.testing import JobTracker

            assert JobTracker(tier_b).run_store([key], [0]).success
            data = bytearray(Path(tier_b.block_path(key)).read_bytes())
        finally:
            tier_b.close()
    elif kind == "other_layout_version":  # intact, of a newer kvtiers-fs
        head = intact_header(key, context().namespace.fingerprint, BB, checksum(other),
                             layout.LAYOUT_VERSION + 1)
        data = bytearray(head.ljust(4096, b"\0") + other)
    elif kind == "other_key":  # our namespace's valid block of another key, renamed
        head = layout.pack_header(random_keys(1)[0], context().namespace.fingerprint, BB,
                                  checksum(other))
        data = bytearray(head.ljust(4096, b"\0") + other)
    else:
        data = bytearray(rng.randbytes(len(good)))
    return bytes(data)


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_file_at_a_key_is_never_served_and_replaced_by_the_next_store(
        tmp_path: Path, kind: str) -> None:
    (tmp_path / "b").mkdir()
    root = tmp_path / "root"
    root.mkdir()
    tier = open_tier(context(), root)
    key, neighbour = random_keys(2)
    try:
        assert store_keys(tier, [key, neighbour]).success
        path = Path(tier.block_path(key))
        bad = _foreign(kind, key, path.read_bytes(), tmp_path)
        path.write_bytes(bad)
        loaded = load_and_check(tier, [key, neighbour])  # never wrong bytes
        assert loaded.ok == [neighbour] and key in loaded.failed
        assert resolve_lookup(tier, key) is LookupResult.MISS
        stored = store_keys(tier, [key], 4)
        assert stored.ok == [key] and stored.bytes_moved == BB, "reported stored unwritten"
        assert path.read_bytes() != bad
        assert load_and_check(tier, [key]).ok == [key]
        assert tier.stats().usage_bytes == 2 * FILE
    finally:
        tier.close()
    again = open_tier(context(), root)
    try:
        assert load_and_check(again, [key, neighbour]).success
    finally:
        again.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_file_planted_before_the_first_store_is_replaced(tmp_path: Path,
                                                              kind: str) -> None:
    """The index never knew the key: the store's rename finds the file there. It is
    read and verified, found not to be this block, and replaced."""
    (tmp_path / "b").mkdir()
    root = tmp_path / "root"
    root.mkdir()
    ctx = context()
    tier = open_tier(ctx, root)
    key = random_keys(1)[0]
    try:
        # What a valid file of `key` would be, to derive the damaged variants from.
        head = layout.pack_header(key, ctx.namespace.fingerprint, BB,
                                  checksum(block_data(key)))
        good = head.ljust(4096, b"\0") + block_data(key)
        path = Path(tier.block_path(key))
        path.parent.mkdir(mode=0o700, exist_ok=True)
        bad = _foreign(kind, key, good, tmp_path)
        path.write_bytes(bad)
        os.chmod(path, 0o600)
        stored = store_keys(tier, [key])
        assert stored.ok == [key] and stored.bytes_moved == BB
        assert path.read_bytes() == good
        assert load_and_check(tier, [key]).ok == [key]
    finally:
        tier.close()


def test_a_valid_copy_already_at_the_name_is_kept(tmp_path: Path) -> None:
    """A file that is this very block (left by a crash before its commit, say) is
    verified and kept: the store succeeds without replacing it."""
    root = tmp_path / "root"
    root.mkdir()
    tier = open_tier(context(), root)
    key = random_keys(1)[0]
    try:
        assert store_keys(tier, [key]).success
        path = Path(tier.block_path(key))
        inode = path.stat().st_ino
        assert tier.stores[0].remove(layout.ident(key), delete_file=False)  # FORGET
        assert resolve_lookup(tier, key) is LookupResult.MISS
        assert store_keys(tier, [key], 2).ok == [key]
        assert path.stat().st_ino == inode
        assert load_and_check(tier, [key]).ok == [key]
    finally:
        tier.close()


def test_foreign_files_survive_a_rebuild_without_being_served(tmp_path: Path) -> None:
    """With the index gone, start-up indexes the files by name; loads then sort the
    foreign ones out (never served), and start-up never trips over them."""
    (tmp_path / "b").mkdir()
    root = tmp_path / "root"
    root.mkdir()
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(len(KINDS) + 1)
    try:
        assert store_keys(tier, keys).success
        for key, kind in zip(keys, KINDS, strict=False):
            path = Path(tier.block_path(key))
            path.write_bytes(_foreign(kind, key, path.read_bytes(), tmp_path))
    finally:
        tier.close()
    for f in [*ns_dir(root, ctx).glob("snapshot.*"), *ns_dir(root, ctx).glob("journal.*")]:
        f.unlink()
    again = open_tier(context(), root)
    try:
        result = load_and_check(again, keys)
        assert result.ok == keys[-1:]
        assert set(result.failed) == set(keys[:-1])
        assert set(result.failed.values()) <= {FailureReason.CORRUPT, FailureReason.MISSING}
        assert store_keys(again, keys[:-1]).success
        assert load_and_check(again, keys).success
    finally:
        again.close()
