"""Snapshots of the CPU pool: its readable blocks, hottest first, to a zarr store
(`save_pool`), and a snapshot's blocks into a fresh pool (`load_pool`), in the
format of `kvtiers.ops.snapshot_store` - a pool's snapshot loads into a tier and a
tier's into a pool.

The pool and the manager's picture of it live in the engine's process, so these
run there: `kvtiers bench --snapshot-save / --snapshot-load` call them around a
run, `kvtiers serve` (kvtiers-p2p) at a node's start and stop, and an engine or a
tool embedding the manager calls them directly.

Hottest is the pool policy's order of use (`TieringOffloadingManager.
resident_blocks`: its eviction order reversed - the most recently used first for
LRU). Both are calls of the manager's own thread (the scheduler's) between steps,
with no engine call in between: `save_pool` holds `manager.lock` while it reads
the blocks and writes the store (so a peer-serving tier cannot evict under it), but
not for the last rows and the swap into place (`SnapshotWriter.close`), and blocks
on the store's I/O; `load_pool` stores through `prepare_store` /
`complete_store` like the engine does, so write_through copies the blocks down to
the tiers too (collected by the caller's `step` / `drain`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvtiers.contract.keys import BlockKey
from kvtiers.contract.namespace import Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.ops.snapshot import SnapshotResult
from kvtiers.ops.snapshot_store import SnapshotError, SnapshotReader, SnapshotWriter
from kvtiers.sdk.integrity import checksum

if TYPE_CHECKING:
    from kvtiers.manager import TieringOffloadingManager

#: blocks stored into the pool per prepare_store / complete_store
LOAD_BATCH = 64
POOL_SOURCE = "cpu"


def save_pool(manager: TieringOffloadingManager, pool: PoolView, namespace: Namespace,
              url: str, *, hottest: int | None = None,
              storage_options: Mapping[str, Any] | None = None,
              overwrite: bool = False) -> SnapshotResult:
    """The pool's readable blocks, most recently used first (at most `hottest`),
    into a new snapshot at `url`, under `namespace`. `url` must be absent, an
    empty directory or - with `overwrite` - a kvtiers snapshot (`SnapshotWriter`:
    anything else is refused before any work, and a failure leaves what was there
    as it was)."""
    out = SnapshotResult(hottest_by="recency")
    with SnapshotWriter(url, namespace, pool.block_bytes, storage_options=storage_options,
                        hottest_by="recency", source=POOL_SOURCE,
                        overwrite=overwrite) as writer:
        with manager.lock:
            blocks = manager.resident_blocks()[::-1]
            if hottest is not None:
                blocks = blocks[:hottest]
            for key, slot in blocks:
                data = bytes(pool.block(slot))
                writer.add(key, checksum(data), data)
                out.blocks += 1
        writer.close()  # the last rows (copies) and the swap into place, unlocked
    return out


def check_fits(reader: SnapshotReader, pool: PoolView, namespace: Namespace) -> None:
    """`SnapshotError` when the snapshot is another namespace's (naming both) or
    its blocks are not the pool's size."""
    theirs = reader.namespace
    if theirs.fingerprint != namespace.fingerprint:
        raise SnapshotError(
            f"{reader.url}: the snapshot holds namespace {theirs} (model "
            f"{theirs.model!r}); this pool holds {namespace} (model {namespace.model!r}): "
            "refusing to load another namespace's KV")
    if reader.block_bytes != pool.block_bytes:
        raise SnapshotError(f"{reader.url}: blocks of {reader.block_bytes} bytes; the "
                            f"pool's are {pool.block_bytes}")


def load_pool(manager: TieringOffloadingManager, pool: PoolView, namespace: Namespace,
              reader: SnapshotReader) -> SnapshotResult:
    """The snapshot's hottest blocks that fit the pool (`manager.num_slots`), each
    verified against its checksum, stored into the pool coldest first - so the
    hottest end up the most recently used, the last the policy evicts. Blocks the
    pool holds already are kept as they are. Failed stores are counted by reason
    ("pool_full": the pool could not take a batch)."""
    check_fits(reader, pool, namespace)
    out = SnapshotResult(hottest_by=str(reader.attrs.get("hottest_by", "")))
    batch: list[tuple[BlockKey, memoryview]] = []

    def flush() -> None:
        if not batch:
            return
        keys = [k for k, _ in batch]
        prepared = manager.prepare_store(keys)
        if prepared is None:
            out.failed["pool_full"] = out.failed.get("pool_full", 0) + len(keys)
        else:
            data = dict(batch)
            for key, slot in zip(prepared.keys, prepared.slots, strict=True):
                pool.block(slot)[:] = data[key]
            manager.complete_store(prepared.keys, True)
            out.blocks += len(keys)
        batch.clear()

    seen: set[BlockKey] = set()
    for chunk in reader.chunks(first=manager.num_slots, coldest_first=True):
        for key, digest, data in chunk:
            if checksum(data) != digest:
                out.bad.append(key.hex())
                continue
            if key in seen:
                continue
            seen.add(key)
            batch.append((key, data))
            if len(batch) == LOAD_BATCH:
                flush()
    flush()
    return out


__all__ = ["LOAD_BATCH", "POOL_SOURCE", "check_fits", "load_pool", "save_pool"]
