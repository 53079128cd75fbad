"""The `memory` tier: blocks kept in this process's RAM, bounded, verified.

An honest tier, not a mock: it copies on its own threads, never in `submit_*`; it
checksums each block from the bytes it copied and verifies the bytes it placed in
a slot before reporting a load; it evicts with a registered policy within its
capacity and never evicts a block while a load of it is pending. It is what the
core's tests run the manager against, and a real option for a second RAM budget.

Config (`kvtiers.tiers.schemas.MEMORY_SCHEMA`): `capacity_bytes` (required: RAM is
what the engine competes for, so its budget is never guessed), `eviction_policy`
(default "lru"), `threads` (default 1). Usage counts block bytes only, so a
capacity of N * block_bytes holds exactly N blocks.

Locking: one lock per store guards the index, the policy and the byte counts. It is
held for dictionary work only, never while bytes are copied or hashed; stored
blocks are immutable `bytes`, so a copy out of an entry that is evicted meanwhile
still reads the right bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from kvtiers.integrity import checksum
from kvtiers.jobs import FailureReason, JobResult, TransferJob
from kvtiers.keys import BlockKey
from kvtiers.lookup import LookupResult
from kvtiers.policies.base import EvictionPolicy
from kvtiers.stats import StatsRecorder, TierStats
from kvtiers.options import resolve_options
from kvtiers.tier import SecondaryTier, TierContext
from kvtiers.tiers.schemas import MEMORY_SCHEMA
from kvtiers.tiers.workers import JobWorkers


@dataclass(slots=True, eq=False)
class _Block:
    """One stored block. `pins` counts pending loads; compared by identity."""

    data: bytes
    checksum: int
    pins: int = 0


class BlockStore:
    """The bytes and index of one memory tier: one namespace, one capacity bound.

    Every method takes `lock` itself. A tier owns its store; tests may hand one
    store to several tier instances (see `MemoryTier._open_store`) to model storage
    that outlives a tier, which is why the store, not the tier, holds the lock.
    """

    def __init__(self, namespace: str, block_bytes: int, capacity_bytes: int,
                 policy: EvictionPolicy):
        self.namespace = namespace  # the fingerprint every block here belongs to
        self.block_bytes = block_bytes
        self.capacity_bytes = capacity_bytes
        self.policy = policy
        self.lock = threading.Lock()
        self.blocks: dict[BlockKey, _Block] = {}
        self.usage = 0  # bytes of committed blocks
        self.reserved = 0  # bytes promised to stores that are copying now
        self.pinned = 0  # resident blocks with pins > 0 (not evictable)

    def contains(self, key: BlockKey) -> bool:
        with self.lock:
            return key in self.blocks

    def touch(self, keys: Iterable[BlockKey]) -> None:
        with self.lock:
            for key in keys:
                if key in self.blocks:
                    self.policy.touch(key)

    def pin(self, keys: Sequence[BlockKey]) -> list[_Block | None]:
        """Take the resident blocks of `keys` out of eviction (None where absent)."""
        out: list[_Block | None] = []
        with self.lock:
            for key in keys:
                block = self.blocks.get(key)
                if block is not None:
                    self._pin_locked(key, block)
                out.append(block)
        return out

    def _pin_locked(self, key: BlockKey, block: _Block) -> None:
        block.pins += 1
        if block.pins == 1:
            self.policy.pin(key)
            self.pinned += 1

    def unpin(self, keys: Sequence[BlockKey], blocks: Sequence[_Block | None]) -> None:
        with self.lock:
            for key, block in zip(keys, blocks, strict=True):
                if block is None or block.pins == 0:
                    continue
                block.pins -= 1
                # A block dropped meanwhile left the index and the pinned count already.
                if block.pins == 0 and self.blocks.get(key) is block:
                    self.policy.unpin(key)
                    self.pinned -= 1

    def get(self, keys: Sequence[BlockKey]) -> list[_Block | None]:
        with self.lock:
            return [self.blocks.get(k) for k in keys]

    def reserve(self) -> int | None:
        """Room for one more block, evicting unpinned blocks as needed: the number
        evicted, or None (nothing taken, nothing evicted) when it cannot fit."""
        bb = self.block_bytes
        with self.lock:
            over = self.usage + self.reserved + bb - self.capacity_bytes
            need = -(-over // bb) if over > 0 else 0
            if bb > self.capacity_bytes or need > len(self.blocks) - self.pinned:
                return None
            # The policy holds exactly our keys, so its victims are BlockKeys.
            victims = cast("list[BlockKey]", self.policy.evict(need)) if need else []
            for key in victims:
                if self.blocks.pop(key, None) is not None:
                    self.usage -= bb
            self.reserved += bb
            return need

    def commit(self, reserved: int, copies: Iterable[tuple[BlockKey, bytes, int]]) -> None:
        """Insert copied blocks and release `reserved` reservations. A key stored by
        another job while this one copied keeps the copy already there."""
        bb = self.block_bytes
        with self.lock:
            self.reserved -= reserved * bb
            for key, data, digest in copies:
                if key in self.blocks:
                    continue
                self.blocks[key] = _Block(data, digest)
                self.usage += bb
                self.policy.insert(key)

    def drop(self, key: BlockKey, block: _Block) -> None:
        """Forget `block` if it is still the copy of `key` (found corrupt)."""
        with self.lock:
            if self.blocks.get(key) is not block:
                return
            del self.blocks[key]
            self.usage -= self.block_bytes
            if block.pins:
                self.pinned -= 1
            self.policy.remove(key)

    def clear(self) -> None:
        with self.lock:
            for key in self.blocks:
                self.policy.remove(key)
            self.blocks.clear()
            self.usage = self.pinned = 0


class MemoryTier(SecondaryTier):
    """Blocks in RAM, bounded by `capacity_bytes`, evicted by a registered policy."""

    persistent: ClassVar[bool] = False
    shared: ClassVar[bool] = False
    serves_peers: ClassVar[bool] = False
    verifies: ClassVar[bool] = True

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        options = resolve_options(MEMORY_SCHEMA, config, "memory")
        super().__init__(ctx, options)
        self.capacity_bytes: int = options["capacity_bytes"]
        self._stats = StatsRecorder(capacity_bytes=self.capacity_bytes)
        self._store = self._open_store(options)
        self._closed = False
        self._workers = JobWorkers(
            self._run,
            threads=options["threads"],
            name=f"kvtiers-{ctx.name or 'memory'}",
            clock=ctx.clock,
            stats=self._stats,
            on_cancel=self._cancel,
            logger=ctx.logger,
        )

    def _open_store(self, options: Mapping[str, Any]) -> BlockStore:
        """A fresh, empty store. Subclasses may return an existing one (tests that
        model storage outliving the tier)."""
        return BlockStore(
            self.ctx.namespace.fingerprint,
            self.ctx.block_bytes,
            self.capacity_bytes,
            self.ctx.make_policy(
                options["eviction_policy"], max(1, self.capacity_bytes // self.ctx.block_bytes)
            ),
        )

    def _close_store(self) -> None:
        """Free the RAM: a memory tier's blocks do not outlive it."""
        self._store.clear()

    # Scheduler side: never blocks on I/O.

    def lookup(self, key: BlockKey) -> LookupResult:
        hit = not self._closed and self._store.contains(key)
        self._stats.lookup(hit)
        return LookupResult.HIT if hit else LookupResult.MISS

    def submit_store(self, job: TransferJob) -> None:
        self._workers.submit(job, load=False)

    def submit_load(self, job: TransferJob) -> None:
        # Pinned now, not when a worker starts: what lookup called a HIT must not be
        # evicted by a store that runs first.
        pinned = None if self._workers.closed else self._store.pin(job.keys)
        self._workers.submit(job, load=True, state=pinned)

    def get_finished_jobs(self) -> list[JobResult]:
        return self._workers.take_finished()

    def drain(self, timeout: float | None = None) -> bool:
        return self._workers.drain(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._workers.close()
        self._closed = True
        self._close_store()

    def stats(self) -> TierStats:
        return self._stats.snapshot(usage_bytes=self._store.usage)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        if not self._closed:
            self._store.touch(keys)

    def damage(self, key: BlockKey, offset: int | None = None) -> bool:
        """Test hook: flip one byte (default: the middle one) of the stored copy of
        `key` behind the tier's back, as a bad DIMM would. False if not stored."""
        store = self._store
        with store.lock:
            block = store.blocks.get(key)
            if block is None:
                return False
            data = bytearray(block.data)
            data[len(data) // 2 if offset is None else offset] ^= 0xFF
            block.data = bytes(data)
            return True

    # Worker side.

    def _cancel(self, job: TransferJob, load: bool, pinned: Any) -> None:
        if load and pinned is not None:
            self._store.unpin(job.keys, pinned)

    def _run(self, job: TransferJob, load: bool, pinned: Any) -> JobResult:
        if load:
            return self._run_load(job, pinned)
        return self._run_store(job)

    def _run_store(self, job: TransferJob) -> JobResult:
        store, pool = self._store, self.ctx.pool
        result = JobResult(job.job_id)
        present = store.get(job.keys)
        todo: list[tuple[BlockKey, int]] = []
        evicted = 0
        for key, slot, block in zip(job.keys, job.slots, present, strict=True):
            if block is not None:
                result.ok.append(key)  # already here: nothing to copy
                continue
            n = store.reserve()
            if n is None:
                result.failed[key] = FailureReason.FULL
                continue
            evicted += n
            todo.append((key, slot))
        if evicted:
            self._stats.evicted(evicted)
        store.touch(result.ok)
        copies: list[tuple[BlockKey, bytes, int]] = []
        try:
            for key, slot in todo:
                try:
                    data = bytes(pool.block(slot))
                except Exception:
                    self.ctx.logger.exception("store of slot %d failed", slot)
                    result.failed[key] = FailureReason.IO
                    continue
                copies.append((key, data, checksum(data)))
        finally:
            store.commit(len(todo), copies)
        result.ok.extend(key for key, _, _ in copies)
        result.bytes_moved = len(copies) * store.block_bytes
        return result

    def _run_load(self, job: TransferJob, pinned: list[_Block | None] | None) -> JobResult:
        store, pool = self._store, self.ctx.pool
        if pinned is None:
            pinned = [None] * len(job.keys)
        result = JobResult(job.job_id)
        try:
            # Keys absent at submit may have been stored since; they are not pinned,
            # which is fine: their bytes are immutable once stored.
            late = store.get(job.keys) if None in pinned else pinned
            for key, slot, block in zip(job.keys, job.slots, late, strict=True):
                if block is None:
                    result.failed[key] = FailureReason.MISSING
                    continue
                try:
                    dst = pool.block(slot)
                    dst[:] = block.data
                    good = checksum(dst) == block.checksum
                except Exception:
                    self.ctx.logger.exception("load into slot %d failed", slot)
                    result.failed[key] = FailureReason.IO
                    continue
                if good:
                    result.ok.append(key)
                else:
                    self.ctx.logger.warning("block %s failed verification; dropped", key.hex())
                    store.drop(key, block)
                    result.failed[key] = FailureReason.CORRUPT
        finally:
            store.unpin(job.keys, pinned)
        store.touch(result.ok)
        result.bytes_moved = len(result.ok) * store.block_bytes
        return result

