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

Built on the SDK: a `JobEngine` runs the copies (one item per block; `threads`
threads that take loads first), a `BoundedIndex` holds key -> block (pins,
reservations, eviction, removals reported to `ctx.events`). A store job reserves
room in its start hook, copies in its items and commits in its end hook; a load
pins at submit and unpins in its end hook. Stored blocks are immutable `bytes`, so
a copy out of an entry that is evicted meanwhile still reads the right bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers.config.options import resolve_options
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.stats import StatsRecorder, TierStats
from kvtiers.contract.tier import TierContext
from kvtiers.sdk.engine import JobEngine, JobHooks
from kvtiers.sdk.index import BoundedIndex, Pins, Reservation, Verdict
from kvtiers.sdk.indexed_tier import IndexedTier, end_pinned_load, reserve_store
from kvtiers.sdk.integrity import checksum
from kvtiers.sdk.job import Job, Outcome
from kvtiers.tiers.schemas import MEMORY_SCHEMA


@dataclass(slots=True, eq=False)
class _Block:
    """One stored block (compared by identity: a corrupt copy is dropped only if it
    is still the one in the index)."""

    data: bytes
    checksum: int


@dataclass(slots=True, eq=False)
class BlockStore:
    """The blocks of one memory tier: one namespace, one capacity bound. A tier
    owns its store; tests may hand one store to several tier instances (see
    `MemoryTier._open_store`) to model storage that outlives a tier."""

    namespace: str  # the fingerprint every block here belongs to
    block_bytes: int
    index: BoundedIndex[_Block]

    def put(self, key: BlockKey, data: bytes) -> bool:
        """Hold `data` as the block of `key` behind its tier's back (tests seeding
        a tier, as another writer would), evicting as a store would. False when it
        does not fit; True also when `key` is held already (that copy is kept)."""
        with self.index.reserve([(key, self.block_bytes)]) as room:
            if room.verdicts[0] is Verdict.RESERVED:
                room.commit(key, _Block(bytes(data), checksum(data)))
            return room.verdicts[0] is not Verdict.FULL


@dataclass(slots=True)
class _Copies:
    """A store job in flight: its reservation and the blocks its items copied."""

    room: Reservation[_Block]
    blocks: dict[int, _Block]


class MemoryTier(IndexedTier[_Block]):
    """Blocks in RAM, bounded by `capacity_bytes`, evicted by a registered policy.
    `IndexedTier` gives the scheduler side's hand-offs (pins at submit, touch)."""

    engine: JobEngine

    persistent = False
    shared = False
    serves_peers = False
    verifies = True

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        options = resolve_options(MEMORY_SCHEMA, config, "memory")
        super().__init__(ctx, options)
        self.capacity_bytes: int = options["capacity_bytes"]
        self._stats = StatsRecorder(capacity_bytes=self.capacity_bytes)
        self._store = self._open_store(options)
        self.index = self._store.index
        self._closed = False
        self.engine = JobEngine(
            ctx,
            load=JobHooks(block=self._load_block, end=self._end_load),
            store=JobHooks(start=self._reserve, block=self._copy_block, end=self._commit),
            load_threads=options["threads"],
            store_threads=0,  # one set of threads, loads first
            stats=self._stats,
        )

    def _open_store(self, options: Mapping[str, Any]) -> BlockStore:
        """A fresh, empty store. Subclasses may return an existing one (tests that
        model storage outliving the tier)."""
        index: BoundedIndex[_Block] = BoundedIndex.for_tier(
            self.ctx, policy=options["eviction_policy"], capacity_bytes=self.capacity_bytes)
        return BlockStore(self.ctx.namespace.fingerprint, self.ctx.block_bytes, index)

    def _close_store(self) -> None:
        """Free the RAM: a memory tier's blocks do not outlive it."""
        self._store.index.clear()

    # Scheduler side: never blocks on I/O.

    def lookup(self, key: BlockKey) -> LookupResult:
        hit = not self._closed and key in self._store.index
        self._stats.lookup(hit)
        return LookupResult.HIT if hit else LookupResult.MISS

    def close(self) -> None:
        if self._closed:
            return
        self.engine.close()
        self._closed = True
        self._close_store()

    def stats(self) -> TierStats:
        return self._stats.snapshot(usage_bytes=self._store.index.committed_bytes)

    def damage(self, key: BlockKey, offset: int | None = None) -> bool:
        """Test hook: flip one byte (default: the middle one) of the stored copy of
        `key` behind the tier's back, as a bad DIMM would. False if not stored."""
        block = self._store.index.get(key)
        if block is None:
            return False
        data = bytearray(block.data)
        data[len(data) // 2 if offset is None else offset] ^= 0xFF
        block.data = bytes(data)
        return True

    # Engine threads: stores.

    def _reserve(self, job: Job) -> list[int]:
        """Start hook: room for the keys not held yet (evicting as needed; an
        evicted block's bytes go with its entry)."""
        return reserve_store(self.index, job, self._store.block_bytes,
                             plan=lambda room: _Copies(room, {}), stats=self._stats,
                             delete=lambda keys: None)

    def _copy_block(self, job: Job, i: int) -> Outcome:
        data = bytes(self.ctx.pool.block(job.slots[i]))
        copies: _Copies = job.state
        copies.blocks[i] = _Block(data, checksum(data))
        return None

    def _commit(self, job: Job) -> None:
        """End hook: the copied blocks become visible; the rest of the room goes."""
        copies: _Copies | None = job.state
        if copies is None:  # never started (timeout, closed)
            return
        with copies.room as room:
            done = [(job.keys[i], block) for i, block in copies.blocks.items()
                    if job.succeeded(i)]
            room.commit_many([k for k, _ in done], [b for _, b in done], close=True)

    # Engine threads: loads.

    def _load_block(self, job: Job, i: int) -> Outcome:
        pins: Pins[_Block] | None = job.state
        key, index = job.keys[i], self._store.index
        # A key absent at submit may have been stored since; not pinned, which is
        # fine: its bytes are immutable once stored.
        block = pins.locations[i] if pins is not None else None
        if block is None:
            block = index.get(key)
        if block is None:
            return FailureReason.MISSING
        dst = self.ctx.pool.block(job.slots[i])
        dst[:] = block.data
        if checksum(dst) != block.checksum:
            self.ctx.logger.warning("block %s failed verification; dropped", key.hex())
            index.remove(key, block)
            return FailureReason.CORRUPT
        return None

    def _end_load(self, job: Job) -> None:
        end_pinned_load(self.index, job)
