"""Failure isolation and bookkeeping: tiers that raise cost misses, never exceptions;
tiers that never answer cannot pin the pool; stats credit the right tier; events;
and the scheduler-facing calls' smaller promises (prefix scans, touch, drain).

Tests named in the module docstring of test_stateful.py, and those marked "bug:"
below, pin manager bugs found while writing these tests (see the report)."""

from __future__ import annotations

import logging
import os

import pytest
from kvtiers.contract.jobs import JobResult
from kvtiers.contract.lookup import LookupResult
from kvtiers.manager import PrefixLookup

from tests.manager.conftest import BLOCK, key, memory_tier
from tests.manager.fake_tiers import ScriptedTier, StuckTier
from tests.manager.invariants import check_holds, check_structure

HIT, MISS, PENDING, RETRY = (
    LookupResult.HIT,
    LookupResult.MISS,
    LookupResult.HIT_PENDING,
    LookupResult.RETRY,
)


def _scripted(name: str = "scripted", **kwargs):
    tiers: list[ScriptedTier] = []

    def build(ctx):
        tiers.append(ScriptedTier(ctx, **kwargs))
        return tiers[-1]

    return {"type": name, "factory": build}


def _put(h, tier, k):
    data = os.urandom(BLOCK)
    tier.put(k, data)
    h.content[k] = data


# ------------------------------------------------------- tiers that raise


@pytest.mark.parametrize("method", ["lookup", "submit_load", "submit_store", "get_finished_jobs"])
def test_a_raising_tier_costs_misses_never_exceptions(harness, caplog, method):
    h = harness(4, tiers=[_scripted()], breaker_failures=100)
    tier = h.tiers[0]
    _put(h, tier, key(1))
    tier.raising.add(method)
    with caplog.at_level(logging.ERROR, logger="kvtiers.manager"):
        for i in range(3):  # stores copy down (write_through), lookups promote
            h.store([key(10 + i)])
            assert h.mgr.lookup(key(1)) in (HIT, MISS, PENDING)
            h.mgr.step()
            h.mgr.step()
        if method == "submit_load":
            assert h.mgr.slot_of(key(1)) is None  # each reserved slot was given back
        h.mgr.lookup_prefix([key(10), key(1), key(2)])
        h.mgr.stats()
    assert f"{method} raised" in caplog.text
    check_structure(h.mgr, h.pool, h.content)
    stats = h.mgr.stats()["tiers"]["scripted"]
    if method == "lookup":
        assert stats["lookup_errors"] >= 3
    if method == "submit_load":
        assert stats["promotion_failures"] >= 3
    if method == "submit_store":
        assert stats["cascade_failures"] >= 1
    # Once the tier behaves, everything works again.
    tier.raising.clear()
    h.settle()
    assert h.lookup_until_settled(key(1)) is HIT
    h.load_and_check([key(1)])
    h.settle()
    check_holds(h.mgr, {})


def test_a_raising_tier_trips_its_breaker(harness):
    h = harness(4, tiers=[_scripted()], breaker_failures=2, breaker_cooldown_s=10)
    tier = h.tiers[0]
    _put(h, tier, key(1))
    tier.raising.add("lookup")
    assert h.mgr.lookup(key(1)) is MISS
    assert h.mgr.lookup(key(1)) is MISS
    assert h.mgr.stats()["tiers"]["scripted"]["breaker"] == "open"
    asked = tier.calls["lookup"]
    assert h.mgr.lookup(key(1)) is MISS
    assert tier.calls["lookup"] == asked  # skipped while open


def test_raising_stats_close_and_hooks_are_contained(harness, caplog):
    h = harness(4, tiers=[_scripted("a"), _scripted("b")])
    a, b = h.tiers
    a.raising.update({"stats", "close", "on_request_start", "on_request_finished"})
    with caplog.at_level(logging.ERROR, logger="kvtiers.manager"):
        stats = h.mgr.stats()
        h.mgr.on_request_start("r1")
        h.mgr.on_request_finished("r1")
        h.mgr.close()
        h.mgr.close()  # idempotent
    assert "breaker" in stats["tiers"]["a"]  # the manager's own part is still there
    assert stats["tiers"]["b"]["usage_bytes"] == 0
    # A raising hook in one tier does not keep the others from hearing it.
    assert b.requests == [("start", "r1"), ("finished", "r1")]
    assert a.calls["on_request_start"] == a.calls["on_request_finished"] == 1
    assert b.closed and b.calls["close"] == 1
    assert "on_request_start raised" in caplog.text and "close raised" in caplog.text


def test_request_hooks_reach_every_tier_in_order(harness):
    h = harness(4, tiers=[_scripted("a"), _scripted("b")])
    for rid in ("r1", "r2"):
        h.mgr.on_request_start(rid)
    h.mgr.on_request_finished("r1")
    for tier in h.tiers:
        assert tier.requests == [("start", "r1"), ("start", "r2"), ("finished", "r1")]


def test_drain_survives_a_raising_tier(harness):
    """bug: drain() calls tier.drain() unguarded; every other tier call is contained."""
    h = harness(4, tiers=[_scripted()])
    h.tiers[0].raising.add("drain")
    h.mgr.drain(timeout=1)


# ------------------------------------------ tiers that never report


def _stuck_harness(harness, **kwargs):
    h = harness(32, tiers=[memory_tier(64)], job_timeout_s=5, breaker_failures=1,
                breaker_cooldown_s=10, **kwargs)  # fmt: skip
    stuck = StuckTier(h.tiers[0])
    h.mgr._traffic.tiers[0].tier = stuck
    return h, stuck


def test_a_stuck_tier_cannot_pin_the_pool_with_cascades(harness):
    """bug: a timed-out cascade keeps its holds (right: the tier may still read the
    slots) but leaves the in-flight count at once, so each breaker cycle admits a
    new window of cascades: a tier that never reports ends up pinning the pool."""
    h, stuck = _stuck_harness(harness, cascade_queue_blocks=2, max_inflight_cascade_blocks=2)
    limit = h.mgr._traffic.tiers[0].queue_limit
    for cycle in range(8):
        h.store([key(2 * cycle), key(2 * cycle + 1)])
        h.mgr.step()
        h.clock.advance(6)  # past the deadline: the copy times out
        h.mgr.step()
        h.clock.advance(11)  # past the cooldown: half-open, copies admitted again
        h.mgr.step()
        pinned = h.mgr.stats()["pool"]["pinned"]
        assert pinned <= limit, f"cycle {cycle}: {pinned} blocks pinned by a stuck tier"


def test_a_stuck_tier_cannot_quarantine_the_pool(harness):
    """bug: the same with promotions: each timed-out load quarantines its slot until
    the tier reports; a tier that never does eventually quarantines every slot and
    the engine cannot store anything any more."""
    h, stuck = _stuck_harness(harness, cascade_queue_blocks=8)
    for i in range(20):
        h.seed(stuck.inner, key(100 + i))
    for cycle in range(12):
        for i in range(3):
            h.mgr.lookup(key(100 + (3 * cycle + i) % 20))
        h.mgr.step()
        h.clock.advance(6)
        h.mgr.step()
        h.clock.advance(11)
    pool = h.mgr.stats()["pool"]
    quarantined = pool["num_slots"] - pool["free"] - pool["resident"]
    assert quarantined <= pool["num_slots"] // 2, f"{quarantined} of 32 slots quarantined"
    assert h.mgr.prepare_store([key(i) for i in range(16)]) is not None


def test_late_report_of_a_timed_out_cascade_releases_its_holds(harness):
    h, stuck = _stuck_harness(harness)
    h.store([key(1)])
    h.mgr.step()
    assert len(stuck.held) == 1
    h.clock.advance(6)
    h.mgr.step()
    stats = h.mgr.stats()
    assert stats["tiers"]["memory"]["timeouts"] == 1
    assert stats["tiers"]["memory"]["cascade_failures"] == 1
    assert stats["pool"]["pinned"] == 1  # the tier may still be reading the slot
    check_structure(h.mgr, h.pool, h.content)
    stuck.release()
    h.settle()
    assert h.mgr.stats()["pool"]["pinned"] == 0
    assert h.mgr.stats()["tiers"]["memory"]["cascaded_blocks"] == 0  # counted as failed


def test_a_tier_that_omits_a_key_from_its_result_does_not_serve_it(harness):
    """bug (hardening): a promotion result naming a key neither ok nor failed lands
    it as a HIT with whatever the slot holds; only keys reported ok should land."""
    h = harness(4, tiers=[_scripted()])
    tier = h.tiers[0]
    _put(h, tier, key(1))
    _put(h, tier, key(2))
    tier.hold = True
    assert h.mgr.lookup(key(1)) is PENDING
    assert h.mgr.lookup(key(2)) is PENDING
    h.mgr.step()
    ((job, _),) = tier.held
    tier.held = []
    slot = h.mgr.slot_of(key(2))
    h.pool.block(slot)[:] = os.urandom(BLOCK)  # whatever was in the slot before
    h.pool.block(h.mgr.slot_of(key(1)))[:] = h.content[key(1)]
    tier.finished.append(JobResult(job.job_id, ok=[key(1)]))  # key 2: not mentioned
    h.mgr.step()
    assert h.mgr.lookup(key(1)) is HIT
    h.load_and_check([key(1)])
    if h.mgr.lookup(key(2)) is HIT:
        h.load_and_check([key(2)])  # fails: the slot never received the block


# ------------------------------------------------------------------ stats


def test_promoted_hits_are_credited_to_the_tier_they_came_from(harness):
    h = harness(8, tiers=[{**memory_tier(64), "name": "near"}, {**memory_tier(64), "name": "far"}])
    near, far = h.tiers
    h.seed(near, key(1))
    h.seed(far, key(2))
    data = h.seed(far, key(3))
    h.seed(near, key(3), data)  # in both: the first tier in order serves it
    for k in (key(1), key(2), key(3)):
        assert h.lookup_until_settled(k) is HIT
    h.load_and_check([key(1), key(2), key(3)])
    stats = h.mgr.stats()["tiers"]
    assert (stats["near"]["promoted_hits"], stats["far"]["promoted_hits"]) == (2, 1)
    assert stats["near"]["blocks_read"] == 2 and stats["far"]["blocks_read"] == 1
    assert h.mgr.stats()["pool"]["pending"] == 3  # each key was HIT_PENDING once


def test_stats_count_lookups_by_outcome(harness):
    h = harness(4, tiers=[_scripted(probe_gate=True)])
    tier = h.tiers[0]
    try:
        h.store([key(1)])
        h.mgr.prepare_store([key(2)])
        assert [h.mgr.lookup(key(i)) for i in (1, 2, 3)] == [HIT, PENDING, RETRY]
        tier.gate.set()
        assert tier.probe.wait_idle(10)
        assert h.mgr.lookup(key(3)) is MISS
        pool = h.mgr.stats()["pool"]
        assert {k: pool[k] for k in ("lookups", "hits", "pending", "retries", "misses")} == {
            "lookups": 4, "hits": 1, "pending": 1, "retries": 1, "misses": 1,
        }  # fmt: skip
    finally:
        tier.gate.set()


# ----------------------------------------------------------------- events


def test_events_follow_every_way_in_and_out_of_the_pool(harness):
    h = harness(2, tiers=[memory_tier(64)])
    tier = h.tiers[0]
    kinds = lambda: [  # noqa: E731
        (e.kind, e.tier, e.source, sorted(e.keys)) for e in h.mgr.take_events()
    ]
    h.store([key(1)])
    assert kinds() == [("stored", "cpu", None, [key(1)])]
    h.settle()  # the cascade to the tier succeeded: the tier holds it now
    assert kinds() == [("stored", "memory", None, [key(1)])]
    h.store([key(2)], success=False)
    assert kinds() == []  # a failed store was never readable: nothing to announce
    h.seed(tier, key(3))
    assert h.lookup_until_settled(key(3)) is HIT
    assert kinds() == [("stored", "cpu", "memory", [key(3)])]  # a promotion lands
    h.mgr.touch([key(3)])
    h.store([key(4)])  # evicts key 1, the least recently used
    assert kinds() == [("removed", "cpu", None, [key(1)]), ("stored", "cpu", None, [key(4)])]
    h.mgr.reset()
    assert kinds() == [("removed", "cpu", None, sorted([key(3), key(4)]))]
    h.settle()
    assert kinds() == []  # reset dropped key 4's queued cascade: the tier never got it


def test_no_event_for_a_failed_or_timed_out_promotion(harness):
    h, stuck = _stuck_harness(harness)
    h.seed(stuck.inner, key(1))
    h.mgr.take_events()
    assert h.mgr.lookup(key(1)) is PENDING
    h.mgr.step()
    h.clock.advance(6)
    h.mgr.step()
    stuck.release()
    h.settle()
    assert h.mgr.take_events() == []
    h.clock.advance(10)  # the timeout opened the breaker; wait for half-open
    assert h.mgr.lookup(key(1)) is PENDING  # found again: a new promotion
    h.mgr.step()
    stuck.release()
    h.settle()
    assert [e.kind for e in h.mgr.take_events()] == ["stored"]
    h.load_and_check([key(1)])


def test_write_back_block_loaded_while_leaving_goes_when_the_engine_is_done(harness):
    h = harness(2, tiers=[memory_tier(64)], write_policy="write_back")
    h.store([key(1), key(2)])
    h.mgr.take_events()
    assert h.mgr.prepare_store([key(3)]) is None  # key 1 is dirty: copied down first
    assert h.mgr.stats()["tiers"]["memory"]["cascaded_blocks"] == 0
    # Leaving, but still readable: the engine may load it meanwhile.
    assert h.mgr.lookup(key(1)) is HIT
    h.load_and_check([key(1)])
    h.mgr.prepare_load([key(1)])
    h.settle()
    assert h.mgr.stats()["tiers"]["memory"]["cascaded_blocks"] == 1
    # Copied down, but the engine still holds it: it stays, readable; only the copy
    # in the tier is announced.
    assert h.mgr.lookup(key(1)) is HIT
    assert [(e.kind, e.tier, e.keys) for e in h.mgr.take_events()] == [
        ("stored", "memory", [key(1)])
    ]
    assert h.mgr.prepare_store([key(3)]) is None  # only key 2 is a candidate: leaving too
    h.mgr.complete_load([key(1)])  # the engine is done: key 1 goes now
    assert [(e.kind, e.keys) for e in h.mgr.take_events()] == [("removed", [key(1)])]
    h.settle()  # key 2's copy lands in the tier, and so it leaves the pool
    assert [(e.kind, e.tier, e.keys) for e in h.mgr.take_events()] == [
        ("stored", "memory", [key(2)]), ("removed", "cpu", [key(2)])
    ]
    assert h.store([key(3)]) == [key(3)]
    assert h.lookup_until_settled(key(1)) is HIT  # promoted back from the tier
    h.load_and_check([key(1)])


# -------------------------------------------------- scheduler-facing promises


def test_prefix_scan_never_evicts_a_block_it_counted(harness):
    """bug: lookup_prefix reports leading hits, then a promotion later in the same
    scan evicts one of them; the engine's prepare_load of the reported hits fails."""
    h = harness(2, tiers=[memory_tier(64)])
    h.store([key(9)])
    h.settle()  # key 9 copied down
    h.store([key(10), key(11)])  # evicts key 9 from the pool; key 10 is now oldest
    h.settle()
    res = h.mgr.lookup_prefix([key(10), key(9)])
    assert res == PrefixLookup(1, True)
    h.load_and_check([key(10)])  # KeyError today: key 10 was evicted by key 9's promotion


def test_touch_reaches_the_tiers(harness):
    """bug (or docstring): touch() promises to refresh recency 'in the pool (and
    tiers that care)' but never calls the tiers' optional touch()."""
    h = harness(4, tiers=[_scripted()])
    h.store([key(1)])
    h.mgr.touch([key(1), key(2)])
    assert h.tiers[0].touched == [[key(1), key(2)]]


def test_drain_waits_for_every_queued_cascade(harness):
    """bug: drain() steps, drains the tiers once and steps again; with more queued
    cascades than one in-flight window, it returns with work still queued or
    running (found by the stateful test)."""
    h = harness(8, tiers=[memory_tier(64)], max_job_blocks=2, max_inflight_cascade_blocks=2)
    h.store([key(i) for i in range(6)])
    h.mgr.drain(timeout=10)
    stats = h.mgr.stats()
    assert stats["tiers"]["memory"]["cascaded_blocks"] == 6
    assert stats["tiers"]["memory"]["queued_cascades"] == 0
    assert stats["pool"]["pinned"] == 0
