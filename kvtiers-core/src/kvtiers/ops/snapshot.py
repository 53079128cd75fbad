"""Snapshots of a persistent tier's blocks to and from a zarr store
(`kvtiers snapshot save` / `load`): pre-warm a new deployment with a known cache.

`save_tier` loads the tier's blocks - newest first (the tiers' inventory has when
each block was stored, not its recency, so newest stands for hottest), at most
`hottest` - into a small pool, `BATCH` blocks a job, checksums each block's bytes
and appends it to the store. `load_tier` reads the store a chunk at a time,
verifies every block against its stored checksum and stores the good ones into
the tier, `BATCH` a job, through the tier's own `submit_store` (its accounting,
eviction and capacity apply). Both run on the caller's thread, block on I/O, and
never hold more than a chunk and a pool of `BATCH` blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtiers.integrity import checksum
from kvtiers.jobs import JobResult, TransferJob
from kvtiers.keys import BlockKey
from kvtiers.ops.snapshot_store import SnapshotReader, SnapshotWriter
from kvtiers.tier import SecondaryTier

BATCH = 64
#: seconds one job may take before it is reported failed
JOB_TIMEOUT_S = 600.0
_ids = itertools.count(1)


@dataclass
class SnapshotResult:
    blocks: int = 0  # moved
    failed: dict[str, int] = field(default_factory=dict)  # by reason
    bad: list[str] = field(default_factory=list)  # hex keys whose bytes failed the checksum

    def as_dict(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "failed": self.failed, "bad": self.bad}


def _run(tier: SecondaryTier, keys: list[BlockKey], load: bool) -> JobResult:
    job = TransferJob(next(_ids), keys, list(range(len(keys))), None)
    (tier.submit_load if load else tier.submit_store)(job)
    if not tier.drain(JOB_TIMEOUT_S):
        raise TimeoutError(f"a {'load' if load else 'store'} job of {len(keys)} blocks did "
                           f"not end within {JOB_TIMEOUT_S:.0f} s")
    for r in tier.get_finished_jobs():
        if r.job_id == job.job_id:
            return r
    raise RuntimeError(f"job {job.job_id} was not reported")  # a tier breaking its contract


def save_tier(tier: SecondaryTier, url: str, *, hottest: int | None = None,
              storage_options: Mapping[str, Any] | None = None) -> SnapshotResult:
    """The tier's blocks (newest first, at most `hottest`) into a new snapshot at
    `url` (replaced if there). The tier's pool must have `BATCH` slots."""
    inv = tier.inventory(ages=True)
    records = sorted(inv, key=lambda b: -(b.stored_at or 0.0))
    if hottest is not None:
        records = records[:hottest]
    pool = tier.ctx.pool
    writer = SnapshotWriter(url, tier.ctx.namespace, pool.block_bytes,
                            storage_options=storage_options)
    out = SnapshotResult()
    for i in range(0, len(records), BATCH):
        keys = [r.key for r in records[i : i + BATCH]]
        result = _run(tier, keys, load=True)
        ok = set(result.ok) - set(result.failed)
        for reason, n in result.reasons().items():
            out.failed[reason.value] = out.failed.get(reason.value, 0) + n
        for slot, key in enumerate(keys):
            if key in ok:
                data = bytes(pool.block(slot))
                writer.add(key, checksum(data), data)
                out.blocks += 1
    writer.close()
    return out


def load_tier(tier: SecondaryTier, reader: SnapshotReader) -> SnapshotResult:
    """Every block of `reader` whose bytes match its checksum, stored into the tier
    (whose namespace must be the snapshot's: the caller checks)."""
    pool = tier.ctx.pool
    out = SnapshotResult()
    batch: list[BlockKey] = []

    def flush() -> None:
        if not batch:
            return
        result = _run(tier, list(batch), load=False)
        out.blocks += len(set(result.ok) - set(result.failed))
        for reason, n in result.reasons().items():
            out.failed[reason.value] = out.failed.get(reason.value, 0) + n
        batch.clear()

    for chunk in reader.chunks():
        for key, digest, data in chunk:
            if checksum(data) != digest:
                out.bad.append(key.hex())
                continue
            if key in batch:
                continue
            pool.block(len(batch))[:] = data
            batch.append(key)
            if len(batch) == BATCH:
                flush()
    flush()
    return out


__all__ = ["BATCH", "SnapshotResult", "load_tier", "save_tier"]
