"""A tier on a small, real filesystem (a tmpfs of a few MiB; an ext4 image for
`kvtiers validate`): its metadata stays within the room it states beside
`capacity_bytes` (`kvtiers_fs.overhead`) however long it stores, a filesystem full
of its own journal is compacted - in the process that filled it and in a later
one - instead of failing every store `full` for ever, and `kvtiers validate`
refuses a capacity that leaves no room for that metadata."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kvtiers.errors import ConfigProblem
from kvtiers.testing import random_keys
from kvtiers_fs import overhead
from kvtiers_fs.disk import layout
from kvtiers_fs.journal import records as jr
from kvtiers_fs.schema import check_machine

from tests.fs.child import fill_without_compaction
from tests.fs.helpers import (
    FILE,
    context,
    disk_files,
    load_and_check,
    mounted,
    ns_dir,
    open_tier,
    store_keys,
)

MiB = 1 << 20

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="mounting a small filesystem needs root")


def _used(root: Path) -> int:
    st = os.statvfs(root)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _bound(capacity: int) -> int:
    """What the tier may take on a tmpfs: its capacity plus the stated metadata."""
    return capacity + overhead.metadata_bytes(capacity, FILE, dir_block=0)


def test_the_stated_figures_are_the_formats() -> None:
    assert layout.file_bytes(1) == overhead.MIN_FILE_BYTES
    assert overhead._SHARDS == layout.SHARDS and overhead._HEADER_BYTES == layout.HEADER_BYTES
    assert jr.RECORD.size == overhead._RECORD_BYTES and jr.SNAP.size == overhead._SNAP_HEAD_BYTES


def test_a_full_tier_stores_on_and_on_within_its_capacity_plus_the_stated_metadata(
        tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "m", "8m") as root:
        blocks = 6 * MiB // FILE
        capacity = blocks * FILE
        assert not [p for p in check_machine({"root_dir": str(root), "capacity_bytes": capacity})
                    if isinstance(p, ConfigProblem)]
        ctx = context()
        tier = open_tier(ctx, root, blocks)
        try:
            worst, last = 0, []
            # ~13k blocks evicting one another: journals of ~2.5 MiB in all, more than
            # the filesystem has beside the blocks.
            for n in range(1700):
                last = random_keys(8)
                result = store_keys(tier, last)
                assert result.success, (n, result.failed, tier.stats().errors)
                worst = max(worst, _used(root))
            assert worst <= _bound(capacity), (worst, _bound(capacity))
            store = tier.stores[0]
            assert store.rotations + store.compactions > 0
            assert load_and_check(tier, last).success
            assert tier.stats().usage_bytes == disk_files(ns_dir(root, ctx))[1]
        finally:
            tier.close()
        names = sorted(p.name for p in ns_dir(root, ctx).iterdir())
        assert len([n for n in names if n.startswith("journal.")]) <= 2, names
        assert len([n for n in names if n.startswith("snapshot.")]) == 1, names
        assert not [n for n in names if n.endswith(".tmp")], names


def _fill(tier: Any) -> list[bytes]:
    """Store jobs of 8 random blocks until one fails; the keys stored, oldest first."""
    stored: list[bytes] = []
    for _ in range(3000):
        keys = random_keys(8)
        result = store_keys(tier, keys)
        stored += [k for k in keys if k in result.ok]
        if result.failed:
            assert set(result.failed.values()) == {"full"}, result.failed
            return stored
    raise AssertionError("the filesystem never filled")


def test_a_filesystem_full_of_the_tiers_own_journal_is_compacted_by_the_same_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvtiers_fs.namespace.store as store_mod

    with mounted("tmpfs", tmp_path / "m", "8m") as root:
        blocks = 6 * MiB // FILE
        ctx = context()
        tier = open_tier(ctx, root, blocks)
        try:
            # As a tier whose journal is never compacted would: grow it until the
            # filesystem is full.
            store = tier.stores[0]
            limit = store.journal_limit
            monkeypatch.setattr(store_mod, "ROTATE_MIN_BYTES", 1 << 40)
            monkeypatch.setattr(store, "_compact", lambda: False)
            store.journal_limit = 1 << 40
            stored = _fill(tier)
            assert os.statvfs(root).f_bavail * 4096 < 64 << 10
            store.journal_limit = limit
            monkeypatch.undo()
            keys = random_keys(8)
            assert store_keys(tier, keys).success, tier.stats().errors
            assert store.compactions >= 1
            # Blocks stored before are served with their bytes (a few were evicted to
            # make room, by policy).
            held = [k for k in stored if store.contains(layout.ident(k))]
            assert len(held) > blocks - 20 and load_and_check(tier, held[-40:]).success
            for _ in range(50):
                keys = random_keys(8)
                assert store_keys(tier, keys).success, tier.stats().errors
            assert load_and_check(tier, keys).success
            assert _used(root) <= _bound(blocks * FILE)
            assert tier.stats().usage_bytes == disk_files(ns_dir(root, ctx))[1]
        finally:
            tier.close()


def test_a_filesystem_full_of_the_tiers_own_journal_is_compacted_by_a_later_process(
        mp: Any, children: list[Any], tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "m", "8m") as root:
        blocks = 6 * MiB // FILE
        result = mp.Queue()
        child = mp.Process(target=fill_without_compaction, args=(str(root), blocks, 7, result))
        children.append(child)
        child.start()
        stored, errors = result.get(timeout=120)
        child.join(30)
        assert errors.get("full") and stored
        assert os.statvfs(root).f_bavail * 4096 < 64 << 10  # full of its journal

        ctx = context()
        tier = open_tier(ctx, root, blocks)
        try:
            keys = random_keys(8)
            assert store_keys(tier, keys).success, tier.stats().errors
            store = tier.stores[0]
            assert store.compactions >= 1
            held = [k for k in stored if store.contains(layout.ident(k))]
            assert len(held) > blocks - 20 and load_and_check(tier, held[-40:]).success
            for _ in range(300):
                keys = random_keys(8)
                assert store_keys(tier, keys).success, tier.stats().errors
            assert load_and_check(tier, keys).success
            assert _used(root) <= _bound(blocks * FILE)
            assert tier.stats().usage_bytes == disk_files(ns_dir(root, ctx))[1]
        finally:
            tier.close()


def _problems(root: Path, capacity: int) -> list[str]:
    return [p.message for p in check_machine({"root_dir": str(root), "capacity_bytes": capacity})
            if isinstance(p, ConfigProblem)]


def test_validate_refuses_a_capacity_that_leaves_no_room_for_the_metadata_on_tmpfs(
        tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "m", "8m") as root:
        [message] = _problems(root, 15 * MiB // 2)
        assert message.startswith("fs tier: 7.5 MiB plus up to ")
        assert "of the tier's own index (journals, snapshots) is more than the filesystem of " \
               f"{root} holds (8 MiB, 8 MiB free now); set capacity_bytes to at most " in message
        best = int(message.split("at most ")[1].split("(")[1].split(" bytes")[0])
        assert best + overhead.metadata_bytes(best, dir_block=0) <= 8 * MiB
        assert not _problems(root, best)


def test_a_tier_opened_with_no_room_for_its_metadata_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with mounted("tmpfs", tmp_path / "m", "8m") as root:
        tier = open_tier(context(), root, 15 * MiB // 2 // FILE)
        tier.close()
        assert "of the tier's own index is more than the filesystem of " \
               f"{root} holds (8 MiB, 1 root(s) on it)" in caplog.text
        caplog.clear()
        tier = open_tier(context(), root, 6 * MiB // FILE)
        tier.close()
        assert "own index" not in caplog.text


@contextmanager
def _ext4(path: Path, size: str) -> Iterator[Path]:
    """An ext4 image of `size` loop-mounted at `path`, unmounted at the end."""
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("no mkfs.ext4 here to make an ext4 image")
    image = path.with_suffix(".img")
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    path.mkdir()
    got = subprocess.run(["mount", "-o", "loop", str(image), str(path)], capture_output=True)
    if got.returncode:
        pytest.skip(f"cannot loop-mount an ext4 image here: {got.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_validate_counts_the_directories_on_a_disk_filesystem(tmp_path: Path) -> None:
    with _ext4(tmp_path / "ext4", "64M") as root:
        # 48 MiB of blocks would fit the 64 MiB image, not with 4096 shard directories
        # and the index beside them.
        [message] = _problems(root, 48 * MiB)
        assert "of the tier's own index (journals, snapshots, directories) is more than " \
               f"the filesystem of {root} holds" in message
        best = int(message.split("at most ")[1].split("(")[1].split(" bytes")[0])
        assert 0 < best < 48 * MiB and not _problems(root, best)
