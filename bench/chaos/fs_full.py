"""fs: the disk filled by another file mid-run, then the file removed.

A small tmpfs is mounted for the run (root only; skipped otherwise) and an fs tier
stores random blocks on it. Another file (not the tier's) then takes every byte
left: stores must fail `full` while it is there, the blocks stored before must
still load with their bytes, and once the file is removed stores must succeed
again (`recovery_s`: removal to the first store that succeeds). The tier must
leave the other file alone, and its usage must equal the bytes of its block files
on disk."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.chaos.driver import Driver, open_tier
from bench.chaos.report import Row
from tests.fs.helpers import disk_files, ns_dir

NAME = "fs-disk-full"
BLOCK = 16384
MiB = 1 << 20
#: batches of 8 blocks stored before the disk fills, while it is full, and after
PROFILES: dict[str, dict[str, Any]] = {
    "short": {"mount": "8m", "capacity": 4 * MiB, "before": 8, "full": 6, "after": 8},
    "long": {"mount": "32m", "capacity": 16 * MiB, "before": 64, "full": 40, "after": 64},
}


def _mount(path: Path, size: str) -> None:
    """A tmpfs of `size` at `path` (CalledProcessError, with mount's words, if not)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                    str(path)], check=True, capture_output=True, text=True)


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def _fill(path: Path) -> int:
    """Write random bytes to `path` until the filesystem has no byte left; the size."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    written = 0
    try:
        for chunk in (MiB, 4096, 1):
            data = os.urandom(chunk)
            while True:
                try:
                    n = os.write(fd, data)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                written += n
                if n < chunk:
                    break
    finally:
        os.close(fd)
    return written


def run(profile: str, workdir: Path, seed: int) -> list[Row]:
    del seed  # keys and bytes are random; nothing here depends on an order
    p = PROFILES[profile]
    row = Row(NAME)
    if os.geteuid() != 0:
        row.skipped = "mounting a small tmpfs needs root"
        return [row]
    root = workdir / "fs-full"
    try:
        _mount(root, p["mount"])
    except (OSError, subprocess.CalledProcessError) as exc:
        row.skipped = f"cannot mount a tmpfs: {getattr(exc, 'stderr', None) or exc}".strip()
        return [row]
    try:
        _scenario(p, root, row)
    finally:
        _umount(root)
    return [row]


def _scenario(p: dict[str, Any], root: Path, row: Row) -> None:
    tier = open_tier({"type": "fs", "root_dir": str(root), "capacity_bytes": p["capacity"]},
                     "chaos-fs-full", BLOCK)
    drive = Driver(tier, row)
    filler = root / "not-kvtiers.bin"
    try:
        for _ in range(p["before"]):
            if not drive.store().success:
                row.problems.append("a store failed before the disk was full")
        before = list(drive.stored)
        size = _fill(filler)
        row.notes.append(f"another file took the last {size} bytes of the {p['mount']} tmpfs")
        full = succeeded = 0
        for i in range(p["full"]):
            result = drive.store()
            full += sum(r == "full" for r in result.failed.values())
            succeeded += len(result.ok)
            drive.load(before[i * 8 % len(before):][:8])  # the old blocks still serve
        if not full:
            row.problems.append("no store failed `full` while the disk was full")
        if succeeded:
            row.notes.append(f"{succeeded} blocks stored while the disk was full")
        if filler.stat().st_size != size:
            row.problems.append("the other file was changed by the tier")
        filler.unlink()
        gone = time.monotonic()
        for _ in range(50):
            if drive.store().success:
                row.recovery_s = time.monotonic() - gone
                break
        else:
            row.problems.append("stores still fail after the other file was removed")
        for _ in range(p["after"]):
            if not drive.store().success:
                row.problems.append("a store failed after the disk had room again")
        row.rounds = 1
        drive.check_all()
        stats = tier.stats()
        row.usage_bytes = stats.usage_bytes
        row.store_bytes = disk_files(ns_dir(root, tier))[1]
        row.notes.append(f"the tier evicted {drive.removed} blocks (reported removed); "
                         f"its own error counts: {dict(sorted(stats.errors.items()))}")
    finally:
        tier.close()
