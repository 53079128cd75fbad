"""Helpers for the fs tier's tests: tiers over a directory, deterministic block bytes,
real mounts (tmpfs, ramfs, read-only binds) that are always unmounted, and a view of
what is on disk."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvtiers.contract.keys import BlockKey
from kvtiers.contract.tier import TierContext
from kvtiers.testing import JobTracker, make_context, make_namespace
from kvtiers_fs.disk import layout
from kvtiers_fs.tier import FsTier

BB = 16384  # block bytes of most tests
FILE = 4096 + BB  # what one such block takes on disk


def block_data(key: BlockKey, nbytes: int = BB) -> bytes:
    """Random bytes, but the same for a key in every process (never zeros)."""
    return random.Random(key).randbytes(nbytes)


def context(block_bytes: int = BB, slots: int = 64, model: str = "model-a",
            clock: Any = None) -> TierContext:
    return make_context(block_bytes, slots, namespace=make_namespace(model, block_bytes),
                        clock=clock)


def open_tier(ctx: TierContext, root: Path | str | list[str], capacity_blocks: int = 1000,
              **options: Any) -> FsTier:
    roots = root if isinstance(root, list) else str(root)
    config = {"root_dir": roots, "capacity_bytes": capacity_blocks * (4096 + ctx.block_bytes),
              "threads": {"load": 2, "store": 2}, **options}
    return FsTier(ctx, config)


def store_keys(tier: FsTier, keys: list[BlockKey], first_slot: int = 0) -> Any:
    """Store `keys` with their `block_data`, one job; the result."""
    pool = tier.ctx.pool
    slots = list(range(first_slot, first_slot + len(keys)))
    for key, slot in zip(keys, slots, strict=True):
        pool.block(slot)[:] = block_data(key, pool.block_bytes)
    return JobTracker(tier).run_store(keys, slots)


def load_and_check(tier: FsTier, keys: list[BlockKey], first_slot: int = 0) -> Any:
    """Load `keys`; assert every key that loaded ok holds its `block_data`."""
    pool = tier.ctx.pool
    slots = list(range(first_slot, first_slot + len(keys)))
    for slot in slots:
        pool.block(slot)[:] = os.urandom(pool.block_bytes)
    result = JobTracker(tier).run_load(keys, slots)
    for key, slot in zip(keys, slots, strict=True):
        if key in result.ok:
            assert bytes(pool.block(slot)) == block_data(key, pool.block_bytes), \
                f"wrong bytes served for {key.hex()}"
    return result


def intact_header(key: BlockKey, namespace: str, block_bytes: int, digest: int,
                  version: int = layout.LAYOUT_VERSION) -> bytes:
    """A well-formed header (its own checksum right) - of another layout version
    when `version` says so: what a newer kvtiers-fs would write."""
    import xxhash

    raw = bytearray(layout.pack_header(key, namespace, block_bytes, digest))
    raw[8:12] = version.to_bytes(4, "little")
    body = bytes(raw[:-8])
    return body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


def disk_files(ns_dir: Path) -> tuple[int, int, int]:
    """(block files, their bytes, temporary files) under a namespace directory."""
    blocks = nbytes = tmps = 0
    for shard in (ns_dir / "blocks").iterdir() if (ns_dir / "blocks").exists() else ():
        if shard.is_symlink():
            continue  # planted by a test: what is behind it is not the tier's
        try:
            entries = list(os.scandir(shard))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if e.name.endswith(".kvb"):
                blocks += 1
                nbytes += st.st_size
            elif e.name.endswith(".tmp"):
                tmps += 1
    return blocks, nbytes, tmps


def ns_dir(root: Path | str, tier_or_ctx: Any) -> Path:
    ctx = getattr(tier_or_ctx, "ctx", tier_or_ctx)
    return Path(root) / ctx.namespace.fingerprint


@contextlib.contextmanager
def mounted(kind: str, path: Path, size: str = "8m") -> Iterator[Path]:
    """A real filesystem at `path` (tmpfs or ramfs), unmounted at the end whatever
    happens."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", kind, "-o", f"size={size},mode=0700", kind, str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def read_only(mountpoint: Path) -> Iterator[Path]:
    """Remount the filesystem at `mountpoint` read-only (EROFS even for root, and for
    descriptors opened before), then read-write again."""
    subprocess.run(["mount", "-o", "remount,ro", str(mountpoint)], check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mountpoint)], check=False)
