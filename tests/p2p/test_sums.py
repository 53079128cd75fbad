"""`BlockSums`: the checksums a server ships follow its pool - a key evicted and
stored again from other bytes is summed again; a parent that cannot report
removals gets a sum per fetch. A real manager and pool, random bytes."""

from __future__ import annotations

import os
from collections.abc import Sequence

from kvtiers.contract.jobs import TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.parent import ParentManager
from kvtiers.contract.pool_view import PoolView
from kvtiers.manager import TieringOffloadingManager
from kvtiers.policies.lru import LRUPolicy
from kvtiers.sdk.integrity import checksum
from kvtiers_p2p.serve.sums import BlockSums

from tests.p2p.engine import keys_for

SLOTS, BB = 8, 4096


def store(mgr: TieringOffloadingManager, pool: PoolView, keys: Sequence[BlockKey]) -> None:
    out = mgr.prepare_store(keys)
    assert out is not None
    for slot in out.slots:
        pool.block(slot)[:] = os.urandom(BB)
    mgr.complete_store(keys)


def pinned_sum(mgr: TieringOffloadingManager, pool: PoolView, sums: BlockSums,
               key: BlockKey) -> tuple[int, int]:
    """What a fetch does: pin, sum, unpin; with the block's true sum."""
    job = mgr.create_store_job([key])
    assert job is not None
    try:
        return sums.of(key, job.slots[0]), checksum(pool.block(job.slots[0]))
    finally:
        mgr.complete_store_job(job.job_id)


def test_a_key_stored_again_is_summed_again() -> None:
    pool = PoolView.anonymous(SLOTS, BB)
    mgr = TieringOffloadingManager(SLOTS, LRUPolicy.for_slots(SLOTS))
    sums = BlockSums(mgr, pool)
    assert sums.cached
    (k,) = keys_for("sums", 1)
    store(mgr, pool, [k])
    shipped, true = pinned_sum(mgr, pool, sums, k)
    assert shipped == true and len(sums) == 1
    assert pinned_sum(mgr, pool, sums, k) == (true, true)  # kept while it stays
    store(mgr, pool, keys_for("filler", SLOTS))  # evicts k
    assert mgr.slot_of(k) is None
    store(mgr, pool, [k])  # other random bytes under the same key
    shipped, new = pinned_sum(mgr, pool, sums, k)
    assert new != true and shipped == new
    mgr.reset()  # a reset removes them too
    store(mgr, pool, [k])
    shipped, newer = pinned_sum(mgr, pool, sums, k)
    assert newer != new and shipped == newer


def test_too_many_removals_drop_every_sum() -> None:
    pool = PoolView.anonymous(SLOTS, BB)
    mgr = TieringOffloadingManager(SLOTS, LRUPolicy.for_slots(SLOTS))
    sums = BlockSums(mgr, pool)
    keys = keys_for("many", 2)
    store(mgr, pool, keys)
    for k in keys:
        pinned_sum(mgr, pool, sums, k)
    for _ in range(2 * SLOTS):  # removals the server never got to read
        sums.left_pool([keys[1]])
    sums.left_pool([keys[0]])  # one too many to list
    pool.block(mgr.slot_of(keys[0]) or 0)[:] = os.urandom(BB)  # (as if stored again)
    shipped, true = pinned_sum(mgr, pool, sums, keys[0])
    assert shipped == true


class Blind(ParentManager):
    """A parent that cannot report removals (the default `watch_removals`)."""

    def __init__(self, mgr: TieringOffloadingManager):
        self.mgr = mgr

    def lookup(self, key: BlockKey) -> LookupResult:
        return self.mgr.lookup(key)

    def create_store_job(self, keys: Sequence[BlockKey]) -> TransferJob | None:
        return self.mgr.create_store_job(keys)

    def complete_store_job(self, job_id: int) -> None:
        self.mgr.complete_store_job(job_id)


def test_a_parent_that_cannot_report_removals_gets_a_sum_per_fetch() -> None:
    pool = PoolView.anonymous(SLOTS, BB)
    mgr = TieringOffloadingManager(SLOTS, LRUPolicy.for_slots(SLOTS))
    sums = BlockSums(Blind(mgr), pool)
    assert not sums.cached
    (k,) = keys_for("blind", 1)
    store(mgr, pool, [k])
    shipped, true = pinned_sum(mgr, pool, sums, k)
    assert shipped == true and len(sums) == 0
    slot = mgr.slot_of(k)
    assert slot is not None
    pool.block(slot)[:] = os.urandom(BB)  # other bytes, nobody told
    shipped, new = pinned_sum(mgr, pool, sums, k)
    assert shipped == new != true
