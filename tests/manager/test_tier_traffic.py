"""`TierTraffic` on its own, over a `SlotTable` and hand-driven tiers: its job table,
promotions, cascades, deadlines and bounds."""

from __future__ import annotations

import itertools
import os

import pytest
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.contract.tier import TierContext
from kvtiers.manager.event_log import EventLog
from kvtiers.manager.peer_jobs import PeerJobs
from kvtiers.manager.slot_state import FREE, PROMOTING, QUARANTINED, READY
from kvtiers.manager.slot_table import SlotTable
from kvtiers.manager.tier_traffic import TierTraffic
from kvtiers.policies.lru import LRUPolicy

from tests.manager.conftest import BLOCK, key
from tests.manager.fake_tiers import ScriptedTier

NS = Namespace("test/model", (BlockGeometry(2, 2, 64, "float16", 16),))


class Rig:
    def __init__(self, num_slots: int = 4, queue_limit: int = 8, **tier: bool):
        self.clock = ManualClock()
        self.pool = PoolView.anonymous(num_slots, BLOCK)
        self.tier = ScriptedTier(TierContext(self.pool, NS, self.clock, name="s"), **tier)
        self.events = EventLog(enabled=True)
        self.slots = SlotTable(num_slots, LRUPolicy.for_slots(num_slots), self.events)
        self.next_id = itertools.count(1).__next__
        self.traffic = TierTraffic(
            [self.tier], ["s"], self.slots, self.events, self.next_id,
            clock=self.clock, job_timeout_s=5.0, queue_limit=queue_limit, max_job_blocks=2,
            max_inflight_cascade_blocks=4, breaker_failures=3, breaker_cooldown_s=10.0,
        )  # fmt: skip
        self.rt = self.traffic.tiers[0]

    def store(self, *ids: int) -> list[int]:
        out = self.slots.prepare_store([key(i) for i in ids], self.traffic.copy_down)
        assert out is not None
        for slot in out.slots:
            self.pool.block(slot)[:] = os.urandom(BLOCK)
        self.slots.finish_stores(out.keys, self.traffic.cascade)
        return out.slots


def test_a_promotion_reserves_a_slot_then_lands_in_one_job():
    rig = Rig()
    data = {key(i): os.urandom(BLOCK) for i in (1, 2, 3)}
    for k, d in data.items():
        rig.tier.put(k, d)
    assert [rig.traffic.lookup(k) for k in data] == [LookupResult.HIT_PENDING] * 3
    assert rig.traffic.lookup(key(9)) is LookupResult.MISS
    assert [k for k, _ in rig.rt.promotions] == list(data)
    assert all(rig.slots.state[s] == PROMOTING for _, s in rig.rt.promotions)
    rig.traffic.step()  # submitted: chunks of max_job_blocks
    assert rig.tier.calls["submit_load"] == 2 and len(rig.traffic.jobs) == 2
    assert not rig.traffic.idle()
    rig.traffic.step()  # collected
    assert rig.traffic.jobs == {} and rig.traffic.idle()
    for k, d in data.items():
        slot = rig.slots.get(k)
        assert rig.slots.state[slot] == READY and bytes(rig.pool.block(slot)) == d
    assert rig.rt.counters.promoted_hits == 3 and rig.slots.pinned == 0
    assert [(e.kind, e.tier, e.source) for e in rig.events.take()] == [("stored", "cpu", "s")] * 2


def test_a_cascade_holds_its_slot_until_the_tier_reports():
    rig = Rig(hold=True)
    (slot,) = rig.store(1)
    assert rig.slots.holds[slot] == 1 and len(rig.rt.queue) == 1  # the queued cascade's
    rig.traffic.step()
    assert rig.rt.inflight_cascade_blocks == 1 and rig.slots.holds[slot] == 1
    rig.tier.release()
    rig.traffic.step()
    assert rig.slots.holds[slot] == 0 and rig.rt.counters.cascaded_blocks == 1
    assert rig.tier.data[key(1)] == bytes(rig.pool.block(slot))
    assert [(e.kind, e.tier) for e in rig.events.take()] == [("stored", "s")]


def test_a_full_queue_defers_cascades_without_pins_then_copies_them_in_order():
    rig = Rig(num_slots=8, queue_limit=2, hold=True)
    slots = rig.store(1, 2, 3, 4)
    assert [k for k, _ in rig.rt.queue] == [key(1), key(2)]
    assert [k for k, _ in rig.rt.deferred] == [key(3), key(4)]
    assert rig.slots.pinned == 2 and rig.rt.counters.cascades_deferred == 2
    rig.traffic.step()  # 1 and 2 go to the tier; still no room for 3 and 4
    assert rig.rt.inflight_cascade_blocks == 2 and len(rig.rt.deferred) == 2
    assert not rig.traffic.idle() and rig.slots.pinned == 2
    rig.store(5)  # behind the deferred ones, though nothing is queued now
    assert [k for k, _ in rig.rt.deferred] == [key(3), key(4), key(5)]
    for _ in range(3):
        rig.tier.release()
        rig.traffic.step()
    assert rig.traffic.idle() and rig.slots.pinned == 0
    assert rig.rt.counters.cascaded_blocks == 5 and rig.rt.counters.cascades_dropped == 0
    for i, slot in zip((1, 2, 3, 4), slots, strict=True):
        assert rig.tier.data[key(i)] == bytes(rig.pool.block(slot))
    stored = [k for e in rig.events.take() if e.tier == "s" for k in e.keys]
    assert stored == [key(i) for i in (1, 2, 3, 4, 5)]


def test_a_deferred_cascade_whose_block_was_evicted_is_dropped_and_counted():
    rig = Rig(num_slots=4, queue_limit=1, hold=True)
    rig.store(1, 2, 3, 4)  # 1 queued (pinned), 2 3 4 deferred (unpinned)
    rig.traffic.step()
    rig.store(5)  # the pool is full: the LRU unpinned block (2) goes, 5 takes its slot
    assert rig.slots.get(key(2)) is None
    while not rig.traffic.idle():
        rig.tier.release()
        rig.traffic.step()
    assert key(2) not in rig.tier.data and rig.slots.pinned == 0
    assert rig.rt.counters.cascades_dropped == 1 and rig.rt.counters.cascaded_blocks == 4
    for i in (1, 3, 4, 5):
        assert rig.tier.data[key(i)] == bytes(rig.pool.block(rig.slots.get(key(i))))


def test_a_block_deferred_twice_in_one_slot_is_copied_once():
    """bug: a deferred copy holds no pin, so its block can be evicted and stored
    again into the same slot, deferred again; both entries then passed the
    "still in its slot" check and went into one cascade job, whose TransferJob
    refused the repeated key with a ValueError out of `step()` (kvtiers bench
    died with "a key appears more than once")."""
    rig = Rig(num_slots=3, queue_limit=2, hold=True)
    rig.store(1, 2)  # queued, pinned
    (slot,) = rig.store(3)  # deferred
    rig.traffic.step()  # 1 and 2 in flight
    assert rig.store(4) == [slot]  # 3 evicted: 4 in its slot, deferred
    assert rig.store(3) == [slot]  # 4 evicted: 3 back in that slot, deferred again
    assert [k for k, _ in rig.rt.deferred] == [key(3), key(4), key(3)]
    while not rig.traffic.idle():
        rig.tier.release()
        rig.traffic.step()
    assert rig.tier.data[key(3)] == bytes(rig.pool.block(slot))
    assert rig.rt.counters.cascaded_blocks == 3 and rig.slots.pinned == 0
    assert rig.rt.counters.cascades_dropped == 2  # 4 (evicted), the second 3


def test_dropping_the_queue_drops_deferred_cascades_too():
    rig = Rig(queue_limit=2)
    rig.store(1, 2, 3)
    assert len(rig.rt.queue) == 2 and len(rig.rt.deferred) == 1
    rig.traffic.drop_queued()
    assert not rig.rt.queue and not rig.rt.deferred and rig.slots.pinned == 0
    assert rig.rt.counters.cascades_dropped == 3 and rig.traffic.idle()


def test_a_tier_that_went_down_drops_its_deferred_cascades():
    rig = Rig(queue_limit=1, hold=True)
    rig.store(1, 2)
    for _ in range(3):
        rig.rt.breaker.failure()  # breaker_failures=3: open
    rig.traffic.step()
    assert not rig.rt.deferred and rig.rt.counters.cascades_dropped == 1
    rig.store(3)  # down: dropped at once, never deferred
    assert rig.rt.counters.cascades_dropped == 2 and not rig.rt.deferred


def test_a_late_promotion_is_quarantined_until_the_tier_reports():
    rig = Rig(hold=True)
    rig.tier.put(key(1), os.urandom(BLOCK))
    assert rig.traffic.lookup(key(1)) is LookupResult.HIT_PENDING
    rig.traffic.step()
    (slot,) = next(iter(rig.traffic.jobs.values())).slots
    rig.clock.advance(5.0)
    rig.traffic.step()
    assert rig.slots.get(key(1)) is None and rig.slots.state[slot] == QUARANTINED
    assert rig.rt.stuck_blocks == 1 and rig.rt.counters.timeouts == 1
    assert len(rig.traffic.jobs) == 1  # still there: the tier has not reported
    rig.tier.release()
    rig.traffic.step()
    assert rig.slots.state[slot] == FREE and rig.rt.stuck_blocks == 0 and not rig.traffic.jobs
    assert rig.events.take() == []  # it never became readable


def test_a_raising_tier_is_a_miss_and_counts_against_its_breaker():
    rig = Rig()
    rig.tier.raising.add("lookup")
    for _ in range(3):
        assert rig.traffic.lookup(key(1)) is LookupResult.MISS
    assert rig.rt.counters.lookup_errors == 3 and not rig.rt.breaker.allows()
    assert rig.traffic.lookup(key(1)) is LookupResult.MISS
    assert rig.tier.calls["lookup"] == 3  # skipped while open


def test_peer_jobs_and_tier_jobs_share_one_id_space():
    rig = Rig()
    peers = PeerJobs(rig.slots, rig.next_id)
    rig.store(1, 2)
    rig.traffic.step()
    job = peers.create([key(1), key(2)])
    assert job is not None and job.job_id not in rig.traffic.jobs
    assert job.job_id > max(rig.traffic.jobs)
    assert [rig.slots.holds[s] for s in job.slots] == [2, 2]  # its own plus the cascade's
    assert peers.create([key(1), key(7)]) is None and len(peers) == 1
    with pytest.raises(ValueError):
        peers.create([key(1), key(1)])
    assert len(peers) == 1 and [rig.slots.holds[s] for s in job.slots] == [2, 2]
    peers.complete(job.job_id)
    peers.complete(job.job_id)
    assert len(peers) == 0 and [rig.slots.holds[s] for s in job.slots] == [1, 1]


def test_a_lookup_asks_only_the_tiers_allowed_and_names_the_promoting_tier():
    rig = Rig()
    data = os.urandom(BLOCK)
    rig.tier.put(key(1), data)
    asked = rig.tier.calls.get("lookup", 0)
    assert rig.traffic.lookup(key(1), ()) is LookupResult.MISS  # no tier allowed
    assert rig.tier.calls.get("lookup", 0) == asked and rig.slots.get(key(1)) is None
    assert rig.traffic.lookup(key(1), {0}) is LookupResult.HIT_PENDING
    assert rig.traffic.promotion_source(key(1)) == "s"
    rig.traffic.step()  # submitted
    assert rig.traffic.promotion_source(key(1)) == "s"
    rig.traffic.step()  # landed: no longer on its way
    assert rig.traffic.promotion_source(key(1)) is None
    assert bytes(rig.pool.block(rig.slots.get(key(1)))) == data
