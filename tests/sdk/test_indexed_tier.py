"""`IndexedTier` (with `EngineTier`), `end_pinned_load` and `reserve_store`: a small
tier built on them - blocks kept in memory, as the index's locations - passes the
conformance suite, and each promise is checked on its own with real engine threads
and random bytes: a load pins at submit what the index holds, and its end gives the
pins back and touches what was read (only that); a closed engine gets no pins; a store's
reservation settles present and full keys, counts and deletes what it evicted, and
is in `job.state` before `delete` runs, so a `delete` that raises holds no room."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from kvtiers.sdk import (
    BlockKey,
    BoundedIndex,
    FailureReason,
    IndexedTier,
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
    end_pinned_load,
    reserve_store,
)
from kvtiers.testing import (
    TierConformance,
    check_result,
    fill_slots,
    make_context,
    poison_slots,
    random_keys,
    wait_until,
)

BB = 16384


class _Stored:
    """A store's `job.state`: its reservation and the copies its items made."""

    def __init__(self, room: Reservation[bytes]):
        self.room = room
        self.copies: dict[int, bytes] = {}


class HeapTier(IndexedTier[bytes]):
    """Blocks as `bytes`, the index's locations. `gate`, when set, holds every load
    item until it opens; reads of `fail_reads` fail `io`; `fail_delete` makes the
    deletes of evicted blocks raise;
    `load_states` records each load's `job.state` as its end hook found it."""

    engine: JobEngine

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        super().__init__(ctx, config)
        capacity = int(config["capacity_bytes"])
        self.index = BoundedIndex(ctx.make_policy("lru", max(1, capacity // ctx.block_bytes)),
                                  capacity, on_removed=ctx.events.removed)
        self._stats = StatsRecorder(capacity)
        self.gate: threading.Event | None = None
        self.fail_delete = False
        self.deleted: list[bytes] = []
        self.fail_reads: set[BlockKey] = set()
        self.load_states: list[object] = []
        self.engine = JobEngine(
            ctx, load=JobHooks(block=self._load, end=self._end_load),
            store=JobHooks(start=self._reserve, block=self._store, end=self._commit),
            load_threads=2, store_threads=2, stats=self._stats)

    def lookup(self, key: BlockKey) -> LookupResult:
        hit = key in self.index
        self._stats.lookup(hit)
        return LookupResult.HIT if hit else LookupResult.MISS

    def stats(self) -> TierStats:
        return self._stats.snapshot(usage_bytes=self.index.committed_bytes)

    def close(self) -> None:
        self.engine.close()

    # Loads.

    def _load(self, job: Job, i: int) -> Outcome:
        if self.gate is not None:
            assert self.gate.wait(30), "gate never opened"
        if job.keys[i] in self.fail_reads:
            return FailureReason.IO
        pins: Pins[bytes] = job.state
        data = pins.locations[i]
        if data is None:  # absent at submit; stored since?
            data = self.index.get(job.keys[i])
        if data is None:
            return FailureReason.MISSING
        self.ctx.pool.block(job.slots[i])[:] = data
        return None

    def _end_load(self, job: Job) -> None:
        self.load_states.append(job.state)
        end_pinned_load(self.index, job)

    # Stores.

    def _reserve(self, job: Job) -> list[int]:
        return reserve_store(self.index, job, self.ctx.block_bytes, plan=_Stored,
                             stats=self._stats, delete=self._delete)

    def _delete(self, keys: list[bytes]) -> None:
        if self.fail_delete:
            raise OSError("the store is away")
        self.deleted += keys

    def _store(self, job: Job, i: int) -> Outcome:
        plan: _Stored = job.state
        plan.copies[i] = bytes(self.ctx.pool.block(job.slots[i]))
        return None

    def _commit(self, job: Job) -> None:
        plan: _Stored | None = job.state
        if plan is None:  # never started
            return
        with plan.room as room:
            done = [i for i in sorted(plan.copies) if job.succeeded(i)]
            room.commit_many([job.keys[i] for i in done], [plan.copies[i] for i in done])


class TestIndexedTierConformance(TierConformance):
    concurrent_jobs = True

    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        return HeapTier(ctx, {"capacity_bytes": capacity_bytes})


@pytest.fixture
def ctx() -> TierContext:
    return make_context(BB, 16)


@pytest.fixture
def tiers(ctx: TierContext) -> Iterator[list[HeapTier]]:
    made: list[HeapTier] = []
    yield made
    for tier in made:
        if tier.gate is not None:
            tier.gate.set()
        tier.close()


def heap(ctx: TierContext, tiers: list[HeapTier], blocks: int) -> HeapTier:
    tier = HeapTier(ctx, {"capacity_bytes": blocks * BB})
    tiers.append(tier)
    return tier


_ids = iter(range(1, 1 << 30))


def run(tier: HeapTier, keys: Sequence[BlockKey], slots: Sequence[int], *,
        load: bool) -> JobResult:
    job = TransferJob(next(_ids), list(keys), list(slots))
    (tier.submit_load if load else tier.submit_store)(job)
    return wait_for(tier, job)


def wait_for(tier: HeapTier, job: TransferJob) -> JobResult:
    found: list[JobResult] = []

    def reported() -> bool:
        found.extend(r for r in tier.get_finished_jobs() if r.job_id == job.job_id)
        return bool(found)

    wait_until(reported, f"job {job.job_id}")
    check_result(job, found[0])
    return found[0]


def pins_of(tier: HeapTier, keys: Sequence[BlockKey]) -> list[int]:
    entries = tier.index.view().entries
    return [entries[k].pins for k in keys]


def test_a_load_is_pinned_at_submit_and_its_end_releases_and_touches(
        ctx: TierContext, tiers: list[HeapTier]) -> None:
    tier = heap(ctx, tiers, 4)
    a, b, c, d, e, f, gone = random_keys(7)
    blocks = fill_slots(ctx.pool, range(4))
    assert run(tier, [a, b, c, d], range(4), load=False).ok == [a, b, c, d]
    tier.gate = threading.Event()
    poison_slots(ctx.pool, [8, 9, 10])
    load = TransferJob(next(_ids), [a, b, gone], [8, 9, 10])
    tier.submit_load(load)
    assert pins_of(tier, [a, b]) == [1, 1]  # at submit, before any item ran
    # The oldest entries are pinned: a store that needs room evicts the next ones.
    fill_slots(ctx.pool, [4, 5])
    assert run(tier, [e, f], [4, 5], load=False).ok == [e, f]
    assert tier.deleted == [c, d] and tier.stats().evictions == 2
    assert a in tier.index and b in tier.index and c not in tier.index
    tier.gate.set()
    result = wait_for(tier, load)
    assert result.ok == [a, b] and result.failed == {gone: FailureReason.MISSING}
    assert [bytes(ctx.pool.block(s)) for s in (8, 9)] == blocks[:2]
    assert pins_of(tier, [a, b]) == [0, 0]
    # Read means used: a and b are the newest now, in the job's order.
    assert list(tier.index.view().order) == [e, f, a, b]


def test_a_load_touches_only_what_it_read(ctx: TierContext, tiers: list[HeapTier]) -> None:
    tier = heap(ctx, tiers, 4)
    a, b, c = random_keys(3)
    fill_slots(ctx.pool, range(3))
    run(tier, [a, b, c], range(3), load=False)
    tier.fail_reads.add(b)
    result = run(tier, [a, b], [8, 9], load=True)
    assert result.ok == [a] and result.failed == {b: FailureReason.IO}
    # (LRU puts an entry back as the newest when its last pin goes.) Touched after
    # the pins went back, a is the newest; touching b too would have put it last.
    assert list(tier.index.view().order) == [c, b, a]
    assert pins_of(tier, [a, b, c]) == [0, 0, 0]


def test_a_closed_engine_pins_nothing(ctx: TierContext, tiers: list[HeapTier]) -> None:
    tier = heap(ctx, tiers, 4)
    (a,) = random_keys(1)
    fill_slots(ctx.pool, [0])
    run(tier, [a], [0], load=False)
    tier.close()
    assert run(tier, [a], [1], load=True).failed == {a: FailureReason.CLOSED}
    assert tier.load_states == [None] and pins_of(tier, [a]) == [0]


def test_a_store_settles_present_and_full_keys(ctx: TierContext,
                                               tiers: list[HeapTier]) -> None:
    tier = heap(ctx, tiers, 2)
    a, b, c = random_keys(3)
    fill_slots(ctx.pool, range(3))
    run(tier, [a], [0], load=False)
    # a is held (no copy), b fits, c would need a's room: a is the job's own.
    result = run(tier, [a, b, c], range(3), load=False)
    assert result.ok == [a, b] and result.failed == {c: FailureReason.FULL}
    assert result.bytes_moved == BB
    assert tier.deleted == [] and tier.stats().evictions == 0
    assert tier.index.reserved_bytes == 0 and pins_of(tier, [a, b]) == [0, 0]


def test_a_delete_that_raises_holds_no_room(ctx: TierContext, tiers: list[HeapTier]) -> None:
    tier = heap(ctx, tiers, 2)
    a, b, c, d, e = random_keys(5)
    fill_slots(ctx.pool, range(5))
    run(tier, [a, b], [0, 1], load=False)
    tier.fail_delete = True
    result = run(tier, [c, d], [2, 3], load=False)
    assert result.failed == {c: FailureReason.IO, d: FailureReason.IO}
    # The reservation was job.state before the delete ran: the end hook closed it.
    assert tier.index.reserved_bytes == 0 and tier.index.committed_bytes == 0
    tier.fail_delete = False
    assert run(tier, [e], [4], load=False).ok == [e]
    assert tier.index.view().used_bytes == BB
