"""RETRY answers (a tier probing through `AsyncProbe`), prefix scans past them, the
per-tier circuit breaker on the injectable clock, and corrupt promotions."""

from __future__ import annotations

import os

import pytest
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.lookup import LookupResult
from kvtiers.errors import KvtiersError
from kvtiers.manager import PrefixLookup, TieringOffloadingManager
from kvtiers.manager.breaker import BreakerState, CircuitBreaker
from kvtiers.policies.lru import LRUPolicy

from tests.manager.conftest import BLOCK, faulty, key, memory_tier
from tests.manager.fake_tiers import ScriptedTier

HIT, MISS, PENDING, RETRY = (
    LookupResult.HIT,
    LookupResult.MISS,
    LookupResult.HIT_PENDING,
    LookupResult.RETRY,
)


@pytest.fixture
def scripted(harness):
    """A harness over one `ScriptedTier`; `probe=True` answers lookups through an
    AsyncProbe whose batches wait for `tier.gate`. Gates are opened at teardown."""
    made: list[ScriptedTier] = []

    def make(num_slots: int = 8, probe: bool = False, **kwargs):
        def build(ctx):
            tier = ScriptedTier(ctx, probe_gate=probe)
            made.append(tier)
            return tier

        h = harness(num_slots, tiers=[{"type": "scripted", "factory": build}], **kwargs)
        return h, h.tiers[0]

    yield make
    for tier in made:
        tier.gate.set()  # a probe thread waiting on its gate would make close() wait


def _put(h, tier, k):
    data = os.urandom(BLOCK)
    tier.put(k, data)
    h.content[k] = data
    return data


# ---------------------------------------------------------------- RETRY


def test_retry_until_the_probe_answers_then_promotion(scripted):
    h, tier = scripted(probe=True)
    _put(h, tier, key(1))
    assert h.mgr.lookup(key(1)) is RETRY
    assert h.mgr.lookup(key(1)) is RETRY  # asked again before the probe answered
    pool = h.mgr.stats()["pool"]
    assert (pool["retries"], pool["free"], pool["resident"]) == (2, 8, 0)  # nothing reserved
    tier.gate.set()
    assert tier.probe.wait_idle(10)
    assert h.mgr.lookup(key(1)) is PENDING  # found: a slot is reserved, a load starts
    assert h.mgr.stats()["pool"]["free"] == 7
    h.mgr.step()  # submits the load (the scripted tier copies at once)
    assert h.mgr.lookup(key(1)) is PENDING  # landed, but not collected before next step
    h.mgr.step()
    assert h.mgr.lookup(key(1)) is HIT
    h.load_and_check([key(1)])
    assert h.mgr.stats()["tiers"]["scripted"]["promoted_hits"] == 1
    assert tier.calls["probe_batch"] == 1  # the second RETRY did not probe again


def test_retry_then_miss_when_the_probe_finds_nothing(scripted):
    h, tier = scripted(probe=True)
    assert h.mgr.lookup(key(1)) is RETRY
    tier.gate.set()
    assert tier.probe.wait_idle(10)
    assert h.mgr.lookup(key(1)) is MISS
    pool = h.mgr.stats()["pool"]
    assert (pool["misses"], pool["free"], pool["pinned"]) == (1, 8, 0)


def test_retry_of_one_tier_does_not_hide_a_hit_in_the_next(harness):
    tiers = []

    def build(probe):
        def factory(ctx):
            tiers.append(ScriptedTier(ctx, probe_gate=probe))
            return tiers[-1]

        return factory

    specs = [{"type": "a", "factory": build(True)}, {"type": "b", "factory": build(False)}]
    h = harness(8, tiers=specs)
    try:
        _put(h, tiers[1], key(1))
        assert h.mgr.lookup(key(1)) is PENDING  # tier a still probing, tier b has it
        h.settle()
        assert h.mgr.lookup(key(1)) is HIT
        h.load_and_check([key(1)])
        assert h.mgr.stats()["tiers"]["b"]["promoted_hits"] == 1
        assert h.mgr.lookup(key(2)) is RETRY  # a MISS in b, not known in a: RETRY
    finally:
        tiers[0].gate.set()


def test_prefix_scan_keeps_going_past_retry(scripted):
    h, tier = scripted(probe=True)
    h.store([key(0), key(2)])
    _put(h, tier, key(3))
    tier.probe.record(key(3), True)  # known to exist: HIT at once
    tier.probe.record(key(4), False)  # known absent: MISS at once
    calls = tier.calls["lookup"]
    res = h.mgr.lookup_prefix([key(0), key(1), key(2), key(3), key(4), key(5)])
    # One leading hit; key 1 is being probed (RETRY), so ask again next step.
    assert res == PrefixLookup(1, True)
    # The scan went on past the RETRY: key 3's promotion started in this same call...
    assert h.mgr.slot_of(key(3)) is not None
    # ...and it stopped at key 4's MISS: key 5 was never asked.
    assert tier.calls["lookup"] - calls == 3  # keys 1, 3 and 4
    tier.gate.set()
    assert tier.probe.wait_idle(10)
    h.settle()
    # Key 1 does not exist: the next scan stops there with one hit and nothing pending.
    assert h.mgr.lookup_prefix([key(0), key(1), key(2)]) == PrefixLookup(1, False)
    assert h.mgr.lookup_prefix([key(0), key(2), key(3)]) == PrefixLookup(3, False)
    h.load_and_check([key(0), key(2), key(3)])


def test_prefix_scan_of_nothing(harness):
    h = harness(4)
    assert h.mgr.lookup_prefix([]) == PrefixLookup(0, False)
    assert h.mgr.lookup_prefix(iter([key(1)])) == PrefixLookup(0, False)  # any iterable


# ---------------------------------------------------------------- breaker


def test_breaker_counts_consecutive_failures_and_reopens_from_half_open():
    clock = ManualClock()
    b = CircuitBreaker(clock, failures=3, cooldown_s=10)
    assert b.state is BreakerState.CLOSED and b.allows()
    b.failure()
    b.failure()
    b.success()  # a success resets the run of failures
    b.failure()
    b.failure()
    assert b.state is BreakerState.CLOSED
    b.failure()
    assert b.state is BreakerState.OPEN and not b.allows() and b.opened == 1
    clock.advance(9.5)
    assert not b.allows()
    clock.advance(0.5)  # exactly at the end of the cooldown
    assert b.state is BreakerState.HALF_OPEN and b.allows()
    b.failure()  # one failure while half-open is enough
    assert b.state is BreakerState.OPEN and b.opened == 2
    clock.advance(10)
    assert b.state is BreakerState.HALF_OPEN
    b.success()
    assert b.state is BreakerState.CLOSED and b.allows()
    b.failure()
    assert b.state is BreakerState.CLOSED  # the count started again from zero


def test_breaker_rejects_a_threshold_below_one():
    with pytest.raises(ValueError):
        CircuitBreaker(ManualClock(), failures=0)


def _cascade_once(h, k):
    """Store `k` (write_through queues a copy) and run the copy to its result."""
    assert h.store([k]) == [k]
    h.mgr.step()  # submit
    h.mgr.step()  # collect


def test_breaker_opens_skips_the_tier_then_closes_on_a_half_open_success(scripted):
    h, tier = scripted(8, breaker_failures=2, breaker_cooldown_s=10)
    name = "scripted"
    tier.fail = True
    _cascade_once(h, key(0))
    assert h.mgr.stats()["tiers"][name]["breaker"] == "closed"
    _cascade_once(h, key(1))
    stats = h.mgr.stats()["tiers"][name]
    assert stats["breaker"] == "open"
    assert stats["cascade_failures"] == 2 and stats["job_errors"] == {"io": 2}
    # Open: lookups do not reach the tier (a miss), new cascades are dropped.
    _put(h, tier, key(9))
    asked = tier.calls["lookup"]
    assert h.mgr.lookup(key(9)) is MISS
    assert tier.calls["lookup"] == asked
    dropped = stats["cascades_dropped"]
    h.store([key(2)])
    assert h.mgr.stats()["tiers"][name]["cascades_dropped"] == dropped + 1
    assert h.mgr.stats()["pool"]["pinned"] == 0  # a dropped cascade holds nothing
    # Half-open after the cooldown: the tier is used again; a success closes it.
    h.clock.advance(10)
    assert h.mgr.stats()["tiers"][name]["breaker"] == "half_open"
    tier.fail = False
    assert h.mgr.lookup(key(9)) is PENDING
    h.settle()
    assert h.mgr.lookup(key(9)) is HIT
    assert h.mgr.stats()["tiers"][name]["breaker"] == "closed"
    h.load_and_check([key(9)])


def test_breaker_half_open_failure_opens_it_again_at_once(scripted):
    h, tier = scripted(8, breaker_failures=3, breaker_cooldown_s=10)
    tier.fail = True
    for i in range(3):
        _cascade_once(h, key(i))
    assert h.mgr.stats()["tiers"]["scripted"]["breaker"] == "open"
    h.clock.advance(10)
    assert h.mgr.stats()["tiers"]["scripted"]["breaker"] == "half_open"
    _cascade_once(h, key(5))  # one failure, not three
    assert h.mgr.stats()["tiers"]["scripted"]["breaker"] == "open"
    h.clock.advance(5)
    assert h.mgr.stats()["tiers"]["scripted"]["breaker"] == "open"  # a new full cooldown


def test_breaker_holds_queued_cascades_while_open_and_submits_them_after(scripted):
    h, tier = scripted(8, breaker_failures=1, breaker_cooldown_s=10)
    tier.hold = True
    tier.fail = True
    assert h.store([key(0), key(1)]) == [key(0), key(1)]
    h.mgr.step()  # both copies submitted as one job, held by the tier
    assert h.store([key(2)]) == [key(2)]  # queued behind the running job (pinned)
    tier.release()
    h.mgr.step()  # the failure opens the breaker; key 2's copy stays queued
    stats = h.mgr.stats()
    assert stats["tiers"]["scripted"]["breaker"] == "open"
    assert stats["tiers"]["scripted"]["queued_cascades"] == 1
    assert stats["pool"]["pinned"] == 1  # the queued copy keeps its block pinned
    submitted = tier.calls["submit_store"]
    h.mgr.step()
    assert tier.calls["submit_store"] == submitted  # not submitted while open
    h.clock.advance(10)
    tier.fail = False
    tier.hold = False
    h.settle()
    stats = h.mgr.stats()
    assert stats["tiers"]["scripted"]["cascaded_blocks"] == 1
    assert stats["tiers"]["scripted"]["breaker"] == "closed"
    assert stats["pool"]["pinned"] == 0


def test_misses_and_corruption_do_not_trip_the_breaker(harness):
    h = harness(4, tiers=[memory_tier(64)], breaker_failures=1)
    tier = h.tiers[0]
    for i in range(3):
        h.seed(tier, key(i))
        assert h.mgr.lookup(key(i)) is PENDING
        assert tier.damage(key(i))  # the verifying tier will find it corrupt
        h.settle()
    stats = h.mgr.stats()["tiers"]["memory"]
    assert stats["job_errors"] == {"corrupt": 3}
    assert stats["breaker"] == "closed"


# ---------------------------------------------------------------- corruption


def test_corrupt_promotion_is_counted_and_the_key_becomes_a_miss(harness):
    h = harness(4, tiers=[memory_tier(64)])
    tier = h.tiers[0]
    h.seed(tier, key(1))
    h.mgr.take_events()
    assert tier.damage(key(1))
    assert h.mgr.lookup(key(1)) is PENDING
    h.settle()
    stats = h.mgr.stats()
    assert stats["tiers"]["memory"]["job_errors"] == {"corrupt": 1}
    assert stats["tiers"]["memory"]["promotion_failures"] == 1
    assert stats["tiers"]["memory"]["promoted_hits"] == 0
    assert (stats["pool"]["free"], stats["pool"]["pinned"], stats["pool"]["resident"]) == (4, 0, 0)
    # The verifying tier dropped its copy: a plain miss from now on, no "stored" event,
    # and the tier's removal of the bad copy is reported under its name.
    assert h.mgr.lookup(key(1)) is MISS
    events = h.mgr.take_events()
    assert [(e.kind, e.tier, e.keys) for e in events] == [("removed", "memory", [key(1)])]
    assert not any(e.kind == "stored" for e in events)


def test_injected_detected_corruption_never_serves_wrong_bytes(harness):
    spec = faulty(memory_tier(64), corrupt_rate=1.0, corrupt_detected=True, ops=["load"])
    h = harness(4, tiers=[spec])
    h.seed(h.tiers[0], key(1))
    for attempt in range(1, 4):
        # The inner tier keeps its copy, so each lookup promotes again, and each
        # landing is caught as corrupt: never a HIT.
        assert h.mgr.lookup(key(1)) is PENDING
        h.settle()
        stats = h.mgr.stats()["tiers"]["faulty"]
        assert stats["job_errors"] == {"corrupt": attempt}
        assert stats["promoted_hits"] == 0
        assert h.mgr.stats()["pool"]["free"] == 4


def test_undetected_corruption_is_refused_when_only_verifying_tiers_are_allowed(harness):
    h = harness(4)
    spec = faulty(memory_tier(64), corrupt_rate=0.5, corrupt_detected=False)
    bad = h._make_tier(0, spec)
    good = h._make_tier(1, faulty(memory_tier(64), corrupt_rate=0.5, corrupt_detected=True))
    try:
        assert not bad.verifies and good.verifies
        with pytest.raises(KvtiersError, match="FaultyTier"):
            TieringOffloadingManager(4, LRUPolicy(4), [bad, good], require_verified_tiers=True)
        TieringOffloadingManager(4, LRUPolicy(4), [good], require_verified_tiers=True)
    finally:
        bad.close()
        good.close()
