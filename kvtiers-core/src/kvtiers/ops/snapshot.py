"""Snapshots of a persistent tier's blocks to and from a zarr store
(`kvtiers snapshot save` / `load`): pre-warm a new deployment with a known cache.

`save_tier` loads the tier's blocks - hottest first, at most `hottest` - into a
small pool, `BATCH` blocks a job, checksums each block's bytes and appends it to
the store. Hottest means recency where the tier's inventory gives its eviction
order (`NamespaceInventory.eviction_order`: fs lists its index's order of use, the
most recently used last for LRU), else newest by store time (`stored_at`).
`kvtiers.ops.pool_snapshot` does the same for the CPU pool. `load_tier` reads the
store a chunk at a time (coldest first), verifies every block against its stored
checksum and stores the good ones into the tier, `BATCH` a job, through the
tier's own `submit_store` (its accounting, eviction and capacity apply). Both
run on the caller's thread, block on I/O, and never hold more than a chunk and a
pool of `BATCH` blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtiers.contract.jobs import JobResult, TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.tier import SecondaryTier
from kvtiers.ops.snapshot_store import SnapshotReader, SnapshotWriter
from kvtiers.sdk.integrity import checksum

BATCH = 64
#: seconds one job may take before it is reported failed
JOB_TIMEOUT_S = 600.0
_ids = itertools.count(1)


@dataclass
class SnapshotResult:
    blocks: int = 0  # moved
    failed: dict[str, int] = field(default_factory=dict)  # by reason
    bad: list[str] = field(default_factory=list)  # hex keys whose bytes failed the checksum
    #: save: what "hottest" meant ("recency" or "stored_at"); load: the snapshot's
    hottest_by: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "failed": self.failed, "bad": self.bad,
                "hottest_by": self.hottest_by}


def hottest_first(tier: SecondaryTier) -> tuple[list[BlockKey], str]:
    """The tier's blocks hottest first, and what that meant: "recency" when every
    namespace inventory gives the eviction order (several places - an fs tier's
    roots - merged by rank: the hottest of each first, and so on), else
    "stored_at" (newest first; blocks of unknown age last)."""
    inv = tier.inventory()
    if inv.namespaces and all(ns.eviction_order for ns in inv.namespaces):
        ranked: list[tuple[float, int, BlockKey]] = []
        for ns in inv.namespaces:
            n = len(ns.blocks)
            for i, record in enumerate(ns.blocks):  # the next victim first
                ranked.append(((n - i) / n, len(ranked), record.key))
        return [key for _, _, key in sorted(ranked)], "recency"
    records = sorted(tier.inventory(ages=True), key=lambda b: -(b.stored_at or 0.0))
    return [r.key for r in records], "stored_at"


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
              storage_options: Mapping[str, Any] | None = None,
              overwrite: bool = False) -> SnapshotResult:
    """The tier's blocks (hottest first, `hottest_first`; at most `hottest`) into a
    new snapshot at `url`, which must be absent, an empty directory or - with
    `overwrite` - a kvtiers snapshot (`SnapshotWriter`: anything else is refused
    before any work, and a failure leaves what was there as it was). The tier's
    pool must have `BATCH` slots."""
    order, hottest_by = hottest_first(tier)
    if hottest is not None:
        order = order[:hottest]
    pool = tier.ctx.pool
    out = SnapshotResult(hottest_by=hottest_by)
    with SnapshotWriter(url, tier.ctx.namespace, pool.block_bytes,
                        storage_options=storage_options, hottest_by=hottest_by,
                        source=tier.ctx.name, overwrite=overwrite) as writer:
        for i in range(0, len(order), BATCH):
            keys = order[i : i + BATCH]
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
    if hottest_by == "recency":
        # Loading touched the saved blocks hottest first, which would leave the
        # coldest of them the most recent: touch them again the other way round, so
        # the tier's order of use is what it was (the saved ones were its hottest).
        tier.touch(order[::-1])
    return out


def load_tier(tier: SecondaryTier, reader: SnapshotReader) -> SnapshotResult:
    """Every block of `reader` whose bytes match its checksum, stored into the tier
    (whose namespace must be the snapshot's: the caller checks), coldest first."""
    pool = tier.ctx.pool
    out = SnapshotResult(hottest_by=str(reader.attrs.get("hottest_by", "")))
    batch: list[BlockKey] = []

    def flush() -> None:
        if not batch:
            return
        result = _run(tier, list(batch), load=False)
        out.blocks += len(set(result.ok) - set(result.failed))
        for reason, n in result.reasons().items():
            out.failed[reason.value] = out.failed.get(reason.value, 0) + n
        batch.clear()

    # Coldest first: the hottest are stored last, the most recent in the tier's
    # order, the last it would evict when the snapshot is larger than the tier.
    for chunk in reader.chunks(coldest_first=True):
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


__all__ = ["BATCH", "SnapshotResult", "hottest_first", "load_tier", "save_tier"]
