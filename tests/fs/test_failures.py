"""Failures: a full filesystem (a real 8 MiB tmpfs), a read-only filesystem, a root
that vanishes, deadlines, a FIFO planted at a block's name. Each costs per-key
failures with a reason, counted and logged once, never an exception, and the tier
keeps working for what it can."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import kvtiers_fs.disk.blockio as blockio
import pytest
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import JobTracker, random_keys, resolve_lookup, snapshot

from tests.fs.helpers import (
    context,
    disk_files,
    load_and_check,
    mounted,
    ns_dir,
    open_tier,
    read_only,
    store_keys,
)


def test_enospc_on_a_real_small_filesystem(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    with mounted("tmpfs", tmp_path / "small", "8m") as root:
        ctx = context(256 * 1024, slots=48)
        # The configured capacity is far above what the filesystem holds.
        tier = open_tier(ctx, root, capacity_blocks=1000)
        try:
            keys = random_keys(48)
            with caplog.at_level(logging.WARNING):
                results = [store_keys(tier, keys[i : i + 8], i) for i in range(0, 48, 8)]
            ok = [k for r in results for k in r.ok]
            failed = {k: v for r in results for k, v in r.failed.items()}
            assert ok and failed, "the filesystem should have filled up"
            assert set(failed.values()) <= {FailureReason.FULL}, failed
            stats = tier.stats()
            assert stats.errors["full"] == len(failed)
            assert any(k.endswith("ENOSPC") for k in stats.errors)
            enospc_lines = [r for r in caplog.records if "ENOSPC" in r.getMessage()
                            or "No space" in r.getMessage()]
            assert len(enospc_lines) <= 2, "ENOSPC was logged for every block"
            # No half-written or temporary file stays; usage is what is on disk.
            blocks, nbytes, tmps = disk_files(ns_dir(root, ctx))
            assert tmps == 0 and blocks == len(ok) and stats.usage_bytes == nbytes
            # What was stored is still served.
            assert load_and_check(tier, ok[:8], 0).success
        finally:
            tier.close()
        # With a capacity that fits the filesystem, eviction makes room again.
        tier = open_tier(context(256 * 1024, slots=48), root, capacity_blocks=12)
        try:
            fresh = random_keys(8)
            result = store_keys(tier, fresh)
            assert result.success, result.failed
            assert tier.stats().evictions > 0
        finally:
            tier.close()


def test_read_only_root_is_refused_when_the_tier_is_built(tmp_path: Path) -> None:
    from kvtiers.errors import ConfigError

    with (mounted("tmpfs", tmp_path / "root", "1m") as root, read_only(root),
          pytest.raises(ConfigError, match="read-only filesystem")):
        open_tier(context(), root)


def test_an_unwritable_journal_fails_stores_and_serves_loads(tmp_path: Path) -> None:
    """`chattr +i` makes a file refuse even root (EPERM): a permission error."""
    root = tmp_path / "root"
    root.mkdir()
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(4)
    try:
        assert store_keys(tier, keys[:2]).success
        journal = next(ns_dir(root, ctx).glob("journal.*"))
        if os.system(f"chattr +i {journal} 2>/dev/null") != 0:
            pytest.skip("chattr +i is not supported here")
        try:
            result = store_keys(tier, keys[2:], 2)
            assert set(result.failed.values()) == {FailureReason.IO}, result
            assert load_and_check(tier, keys[:2], 8).success
            assert any(k.endswith("EPERM") for k in tier.stats().errors)
        finally:
            os.system(f"chattr -i {journal}")
        assert store_keys(tier, keys[2:], 2).success  # writable again: works again
        blocks, nbytes, tmps = disk_files(ns_dir(root, ctx))
        assert (blocks, tmps) == (4, 0) and tier.stats().usage_bytes == nbytes
    finally:
        tier.close()


def test_unwritable_shard_directory_is_a_per_key_failure(tmp_path: Path) -> None:
    """An immutable directory refuses even root (EPERM), like a permission error."""
    root = tmp_path / "root"
    root.mkdir()
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(16)
    try:
        assert store_keys(tier, keys[:1]).success
        shard = Path(tier.block_path(keys[0])).parent
        rc = os.system(f"chattr +i {shard} 2>/dev/null")
        if rc != 0:
            pytest.skip("chattr +i is not supported here")
        try:
            result = store_keys(tier, keys[1:], 1)
            same = [k for k in keys[1:] if Path(tier.block_path(k)).parent == shard]
            assert {k: FailureReason.IO for k in same}.items() <= result.failed.items()
            assert len(result.ok) == len(keys) - 1 - len(same)
            assert load_and_check(tier, keys[:1], 20).success
        finally:
            os.system(f"chattr -i {shard}")
    finally:
        tier.close()


def test_a_vanished_root_costs_misses_not_exceptions(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(6)
    try:
        assert store_keys(tier, keys[:3]).success
        shutil.rmtree(root)
        loaded = load_and_check(tier, keys[:3], 8)
        assert set(loaded.failed.values()) == {FailureReason.MISSING}
        stored = store_keys(tier, keys[3:], 3)
        assert set(stored.failed.values()) == {FailureReason.IO}
        assert resolve_lookup(tier, keys[4]) is LookupResult.MISS
        tier.stats()
    finally:
        tier.close()  # must not raise either
    assert not root.exists(), "the tier recreated a vanished root"


class _HungOnce:
    """Wraps a read function: the first call hangs until released, like a dead disk."""

    def __init__(self, real: object):
        self.real, self.hang, self.release = real, threading.Event(), threading.Event()

    def __call__(self, *args: object) -> object:
        if not self.hang.is_set():
            self.hang.set()
            assert self.release.wait(30)
        return self.real(*args)  # type: ignore[operator]


@pytest.mark.parametrize("path", ["python", "native"])
def test_a_job_taken_after_its_deadline_times_out_without_io(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             path: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    clock = ManualClock()
    ctx = context(clock=clock)
    tier = open_tier(ctx, root, threads={"load": 1, "store": 1})
    stored, fresh = random_keys(2), random_keys(2)
    if path == "python":  # loads one block at a time, through os.preadv
        monkeypatch.setattr(blockio, "_readmany", None)
        hung = _HungOnce(os.preadv)
    else:  # small blocks of a job read in one native call (BlockIO.read_many)
        if blockio._readmany is None:
            pytest.skip("kvtiers_fs.disk._readmany was not built")
        hung = _HungOnce(blockio._readmany.read_files)
    hang, release = hung.hang, hung.release

    try:
        assert store_keys(tier, stored).success
        if path == "python":
            monkeypatch.setattr(blockio.os, "preadv", hung)
        else:
            monkeypatch.setattr(blockio, "_readmany", type("Hung", (), {"read_files": hung})())
        jobs = JobTracker(tier)
        first = jobs.load(stored[:1], [10])
        assert hang.wait(10)
        # The deadlines pass before either job can be taken (an idle thread of the
        # other kind may take one at once, so the clock moves first).
        deadline = clock() + 5
        clock.advance(10)
        second = jobs.load(stored[1:], [11], deadline=deadline)
        third = jobs.store(fresh, [0, 1], deadline=deadline)
        before = snapshot(ctx.pool)
        release.set()
        r1, r2, r3 = jobs.wait([first, second, third])
        assert r1.success  # the hung read landed late (the manager had quarantined it)
        assert r2.failed == {stored[1]: FailureReason.TIMEOUT}
        assert set(r3.failed.values()) == {FailureReason.TIMEOUT}
        assert bytes(ctx.pool.block(11)) == before[11 * ctx.pool.slot_bytes :][: ctx.block_bytes]
        assert not any(Path(tier.block_path(k)).exists() for k in fresh), "I/O after deadline"
        assert tier.stats().usage_bytes == 2 * (4096 + ctx.block_bytes)
    finally:
        release.set()
        tier.close()


def test_a_fifo_at_a_block_name_does_not_hang_a_thread(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    ctx = context()
    tier = open_tier(ctx, root)
    keys = random_keys(2)
    try:
        assert store_keys(tier, keys).success
        path = Path(tier.block_path(keys[0]))
        path.unlink()
        os.mkfifo(path, 0o600)
        result = load_and_check(tier, keys, 8)
        assert result.failed == {keys[0]: FailureReason.CORRUPT}
        assert keys[1] in result.ok
    finally:
        tier.close()
