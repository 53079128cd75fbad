"""The `scratch` tier: KV-cache blocks as files in one directory, bounded, verified.

The minimal tier of docs/plugins.md. The hard parts come from the core's SDK:

- a `BoundedIndex` knows which file holds each key, within `capacity_bytes`: it
  reserves room for a store before the store writes, evicting by a registered
  policy but never a block being loaded (pinned at submit) nor one of the storing
  job's own; it reports every block that leaves to `ctx.events`.
- a `JobEngine` runs every job on the tier's threads and reports it exactly once,
  after its last block, with `timeout`, `closed` and `io` (an exception) handled.

The scheduler thread only touches memory (the index, the engine's queues); every
file operation runs on the engine's threads. Each file is the block's checksum
(`kvtiers.sdk.checksum_bytes`) followed by its bytes; a load verifies the bytes it placed in
the slot, and a bad copy is reported `corrupt` and deleted.

Not persistent: the tier deletes its block files (`*.kv`) when it opens - what a
crashed run left - and when it closes. Nothing else in the directory is touched.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvtiers.sdk import (
    CHECKSUM_BYTES,
    BlockKey,
    BoundedIndex,
    FailureReason,
    Job,
    JobEngine,
    JobHooks,
    JobResult,
    LookupResult,
    Outcome,
    Pins,
    Reservation,
    SecondaryTier,
    StatsRecorder,
    TierContext,
    TierStats,
    TransferJob,
    Verdict,
    checksum_bytes,
    resolve_options,
    verify,
)

from kvtiers_scratch.plugin import SCHEMA

SUFFIX = ".kv"  # every file the tier writes ends so


class ScratchTier(SecondaryTier):
    """Config (`kvtiers_scratch.plugin.SCHEMA`): `root_dir`, `capacity_bytes`,
    `eviction_policy` (default "lru"), `threads` (default 2)."""

    verifies = True  # persistent, shared, serves_peers: False, as SecondaryTier says

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        options = resolve_options(SCHEMA, config, "scratch")  # checked, defaults filled
        super().__init__(ctx, options)
        self.root = Path(options["root_dir"])
        self.root.mkdir(parents=True, exist_ok=True)
        self._delete_block_files()
        capacity = options["capacity_bytes"]
        self._stats = StatsRecorder(capacity_bytes=capacity)
        # key -> the file that holds its block.
        self._index: BoundedIndex[Path] = BoundedIndex.for_tier(
            ctx, policy=options["eviction_policy"], capacity_bytes=capacity)
        self._engine = JobEngine(
            ctx,
            load=JobHooks(block=self._read, end=self._end_load),
            store=JobHooks(start=self._reserve, block=self._write, end=self._commit),
            load_threads=options["threads"],
            store_threads=0,  # every thread takes loads first, then stores
            stats=self._stats,
        )

    # --- the scheduler thread: memory only, never blocks -----------------------------

    def lookup(self, key: BlockKey) -> LookupResult:
        hit = key in self._index  # committed entries only: a HIT is readable now
        self._stats.lookup(hit)
        return LookupResult.HIT if hit else LookupResult.MISS

    def submit_store(self, job: TransferJob) -> None:
        self._engine.submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        # Pinned now, not when a thread gets to it: what lookup called a HIT must not
        # be evicted by a store that runs first. The end hook unpins, whatever happens.
        self._engine.submit_load(job, self._index.pin(job.keys))

    def touch(self, keys: Iterable[BlockKey]) -> None:
        self._index.touch(keys)

    def get_finished_jobs(self) -> list[JobResult]:
        return self._engine.take_finished()

    def stats(self) -> TierStats:
        return self._stats.snapshot(usage_bytes=self._index.committed_bytes)

    # --- any thread; these block ------------------------------------------------------

    def drain(self, timeout: float | None = None) -> bool:
        return self._engine.drain(timeout)

    def close(self) -> None:
        if self._engine.closed:
            return
        self._engine.close()  # queued jobs fail with `closed`; running ones end first
        self._index.clear()  # every block leaves (reported to ctx.events)
        self._delete_block_files()

    def path_of(self, key: BlockKey) -> Path | None:
        """The file that holds `key`'s block, if the tier holds it (for tests)."""
        return self._index.get(key)

    # --- the engine's threads: stores --------------------------------------------------

    def _reserve(self, job: Job) -> list[int]:
        """A store's start hook: room for the keys not held yet. Returns the indices
        of the blocks to write."""
        room = self._index.reserve([(key, self.ctx.block_bytes) for key in job.keys])
        job.state = room  # before anything can raise: the end hook closes it
        for _, path in room.evicted:
            path.unlink(missing_ok=True)
        self._stats.evicted(len(room.evicted))
        todo = []
        for i, verdict in enumerate(room.verdicts):
            if verdict is Verdict.RESERVED:
                todo.append(i)
            elif verdict is Verdict.PRESENT:
                job.succeed(i)  # held already: nothing to copy
            else:  # only pinned blocks or the job's own are left to evict
                job.fail(i, FailureReason.FULL)
        return todo

    def _write(self, job: Job, i: int) -> Outcome:
        """One block into a new file: its checksum, computed from the very bytes
        written, then the bytes."""
        data = self.ctx.pool.block(job.slots[i])
        with open(self._file(job, i), "xb") as f:
            f.write(checksum_bytes(data))
            f.write(data)
        return None

    def _commit(self, job: Job) -> None:
        """A store's end hook: the files written become visible to lookup - only now,
        so a HIT is always readable - and the rest of the room is given back."""
        room: Reservation[Path] | None = job.state
        if room is None:  # never started (timeout, closed)
            return
        with room:
            for i, verdict in enumerate(room.verdicts):
                if verdict is not Verdict.RESERVED:
                    continue
                path = self._file(job, i)
                if not (job.succeeded(i) and room.commit(job.keys[i], path)):
                    path.unlink(missing_ok=True)  # a failed write, or another job's copy won

    def _file(self, job: Job, i: int) -> Path:
        # One file per copy, named by key and job: a file is never written twice, so
        # deleting one copy never deletes another.
        return self.root / f"{job.keys[i].hex()}.{job.job_id}{SUFFIX}"

    # --- the engine's threads: loads ----------------------------------------------------

    def _read(self, job: Job, i: int) -> Outcome:
        """One block into its slot, verified there: what the slot holds is what the
        engine will use."""
        pins: Pins[Path] = job.state
        key = job.keys[i]
        path = pins.locations[i]
        if path is None:  # absent at submit; stored since?
            path = self._index.get(key)
        if path is None:
            return FailureReason.MISSING
        dest = self.ctx.pool.block(job.slots[i])
        try:
            with open(path, "rb") as f:
                stored = f.read(CHECKSUM_BYTES)
                whole = f.readinto(dest) == len(dest)
        except FileNotFoundError:  # deleted behind the tier's back
            self._index.remove(key, path)
            return FailureReason.MISSING
        if not (whole and verify(dest, stored)):
            self.ctx.logger.warning("scratch tier: %s failed verification; deleted", path)
            self._index.remove(key, path)  # this copy only, reported to ctx.events
            path.unlink(missing_ok=True)
            return FailureReason.CORRUPT
        return None

    def _end_load(self, job: Job) -> None:
        """A load's end hook: unpin; a block loaded is a block used."""
        pins: Pins[Path] = job.state
        pins.release()
        self._index.touch(key for i, key in enumerate(job.keys) if job.succeeded(i))

    # --- opening and closing -------------------------------------------------------------

    def _delete_block_files(self) -> None:
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                    os.unlink(entry.path)
