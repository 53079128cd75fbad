"""State transitions of the TieringOffloadingManager, with real memory and faulty tiers."""

from __future__ import annotations

import os

import pytest
from kvtiers.contract.jobs import TransferJob
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.stats import TierStats
from kvtiers.contract.tier import SecondaryTier, TierContext
from kvtiers.errors import KvtiersError
from kvtiers.manager import TieringOffloadingManager
from kvtiers.policies.lru import LRUPolicy

from tests.manager.conftest import BLOCK, faulty, key, memory_tier

HIT, MISS, PENDING, RETRY = (
    LookupResult.HIT,
    LookupResult.MISS,
    LookupResult.HIT_PENDING,
    LookupResult.RETRY,
)


def test_store_then_hit_and_bytes(harness):
    h = harness(8)
    keys = [key(i) for i in range(5)]
    assert h.store(keys) == keys
    assert all(h.mgr.lookup(k) is HIT for k in keys)
    h.load_and_check(keys)
    assert h.mgr.lookup(key(99)) is MISS


def test_pending_store_is_hit_pending_then_failed_store_is_gone(harness):
    h = harness(4)
    out = h.mgr.prepare_store([key(1)])
    assert out.keys == [key(1)] and len(out.slots) == 1
    assert h.mgr.lookup(key(1)) is PENDING
    with pytest.raises(KeyError):
        h.mgr.prepare_load([key(1)])
    h.mgr.complete_store([key(1)], success=False)
    assert h.mgr.lookup(key(1)) is MISS
    assert h.mgr.stats()["pool"]["free"] == 4


def test_prepare_store_skips_present_and_duplicates(harness):
    h = harness(8)
    h.store([key(1)])
    out = h.mgr.prepare_store([key(1), key(2), key(2), key(3)])
    assert out.keys == [key(2), key(3)]
    h.mgr.complete_store(out.keys)


def test_eviction_is_lru_and_skips_pinned(harness):
    h = harness(4)
    h.store([key(i) for i in range(4)])
    h.mgr.touch([key(0)])  # 1 is now the oldest
    slots = h.mgr.prepare_load([key(1)])  # pinned: not a candidate
    out = h.mgr.prepare_store([key(10), key(11)])
    assert set(out.evicted) == {key(2), key(3)}
    h.mgr.complete_store(out.keys, success=False)
    assert h.mgr.lookup(key(1)) is HIT
    assert len(slots) == 1
    h.mgr.complete_load([key(1)])


def test_prepare_store_refuses_when_everything_is_pinned(harness):
    h = harness(3)
    keys = [key(i) for i in range(3)]
    h.store(keys)
    h.mgr.prepare_load(keys)
    assert h.mgr.prepare_store([key(9)]) is None
    assert all(h.mgr.lookup(k) is HIT for k in keys)  # nothing was evicted
    h.mgr.complete_load(keys)
    assert h.mgr.prepare_store([key(9)]) is not None


def test_prepare_load_of_a_miss_raises_and_takes_no_holds(harness):
    h = harness(4)
    h.store([key(1)])
    with pytest.raises(KeyError):
        h.mgr.prepare_load([key(1), key(2)])
    assert h.mgr.stats()["pool"]["pinned"] == 0


def test_lookup_prefix_counts_leading_hits(harness):
    h = harness(8)
    h.store([key(0), key(1), key(2)])
    res = h.mgr.lookup_prefix([key(0), key(1), key(2), key(3), key(4)])
    assert (res.hits, res.retry) == (3, False)
    h.mgr.prepare_store([key(5)])
    res = h.mgr.lookup_prefix([key(0), key(5), key(1)])
    assert (res.hits, res.retry) == (1, True)


def test_events_report_stored_and_removed(harness):
    h = harness(2)
    h.store([key(1), key(2)])
    h.store([key(3)])
    events = h.mgr.take_events()
    kinds = [(e.kind, set(e.keys)) for e in events]
    assert ("stored", {key(1), key(2)}) in kinds
    assert ("removed", {key(1)}) in kinds
    assert ("stored", {key(3)}) in kinds
    assert h.mgr.take_events() == []


def test_write_through_then_promotion_credits_the_tier(harness):
    h = harness(4, tiers=[memory_tier(64)])
    keys = [key(i) for i in range(4)]
    h.store(keys)
    h.settle()
    assert h.mgr.stats()["tiers"]["memory"]["cascaded_blocks"] == 4
    h.store([key(i) for i in range(10, 14)])  # evicts the first four from the pool
    h.settle()
    assert h.mgr.lookup(key(0)) is PENDING
    assert h.lookup_until_settled(key(0)) is HIT
    h.load_and_check([key(0)])
    stats = h.mgr.stats()["tiers"]["memory"]
    assert stats["promoted_hits"] == 1


def test_write_back_copies_on_eviction_only(harness):
    h = harness(4, tiers=[memory_tier(64)], write_policy="write_back")
    h.store([key(i) for i in range(4)])
    h.settle()
    assert h.mgr.stats()["tiers"]["memory"]["cascaded_blocks"] == 0
    # Evicting dirty blocks starts their copies; the first store cannot get slots yet.
    assert h.mgr.prepare_store([key(10), key(11)]) is None
    assert h.mgr.stats()["pool"]["evictions"] == 0  # copying down; not gone yet
    h.settle()
    assert h.mgr.stats()["tiers"]["memory"]["cascaded_blocks"] == 2
    assert h.mgr.stats()["pool"]["evictions"] == 2  # copied down, then freed
    assert h.store([key(10), key(11)]) == [key(10), key(11)]
    # Every slot holds a dirty block: the promotion's slot must be copied down
    # first, so the first answer is a miss that starts that copy.
    assert h.mgr.lookup(key(0)) is MISS
    h.settle()
    assert h.lookup_until_settled(key(0)) is HIT
    h.load_and_check([key(0)])


def test_cascade_queue_is_bounded_and_drops_are_counted(harness):
    # The tier hangs: nothing it is given ever finishes.
    h = harness(16, tiers=[faulty(memory_tier(64), hang_rate=1.0)],
                cascade_queue_blocks=2, max_inflight_cascade_blocks=2, max_job_blocks=2)
    h.store([key(i) for i in range(8)])
    h.mgr.step()
    h.store([key(i) for i in range(8, 16)])
    stats = h.mgr.stats()
    tier = stats["tiers"]["faulty"]
    # What found no room waits unpinned (deferred) or was dropped, and is counted.
    assert tier["cascades_dropped"] + tier["deferred_cascades"] >= 16 - 2 - 2
    assert tier["deferred_cascades"] <= 16  # one entry per pool slot at most
    # Holds never exceed what the bounded queue and in-flight window allow.
    assert stats["pool"]["pinned"] <= 4


def test_failing_tier_opens_breaker_and_costs_only_misses(harness):
    h = harness(4, tiers=[faulty(memory_tier(64), error_rate=1.0)], breaker_failures=2,
                breaker_cooldown_s=30)
    h.store([key(i) for i in range(2)])
    h.settle()
    h.store([key(i) for i in range(2, 4)])
    h.settle()
    tier = h.mgr.stats()["tiers"]["faulty"]
    assert tier["breaker"] == "open"
    assert tier["cascade_failures"] >= 1
    # While open, the tier is skipped: a miss, no exception.
    h.store([key(i) for i in range(10, 14)])
    assert h.mgr.lookup(key(0)) is MISS
    h.clock.advance(31)
    assert h.mgr.stats()["tiers"]["faulty"]["breaker"] == "half_open"


def _seed_inner(h, tier, k):
    """Put a block into `tier` behind the manager's back; return its bytes."""
    slot = h.pool.num_slots - 1
    data = os.urandom(BLOCK)
    h.pool.block(slot)[:] = data
    tier.submit_store(TransferJob(10_000 + slot, [k], [slot]))
    tier.drain(10)
    assert tier.get_finished_jobs()[0].success
    h.content[k] = data
    return data


def test_hang_reported_by_the_tier_at_its_deadline_is_a_miss(harness):
    h = harness(4, tiers=[faulty(memory_tier(64), hang_rate=1.0, hang_s=None)], job_timeout_s=5)
    _seed_inner(h, h.tiers[0].inner, key(1))
    assert h.mgr.lookup(key(1)) is PENDING
    h.mgr.step()  # the promotion is submitted, and hangs
    h.clock.advance(6)
    h.mgr.step()
    stats = h.mgr.stats()
    assert stats["tiers"]["faulty"]["job_errors"]["timeout"] == 1
    assert stats["pool"]["free"] == 4  # the tier reported: no I/O can touch the slot
    assert stats["pool"]["resident"] == 0


class _StuckTier(SecondaryTier):
    """Holds loads until `release()`: a tier that misses its deadline and reports late."""

    def __init__(self, inner):
        super().__init__(inner.ctx, {})
        self.inner = inner
        self.held = []

    def lookup(self, key):
        return self.inner.lookup(key)

    def submit_store(self, job):
        self.inner.submit_store(job)

    def submit_load(self, job):
        self.held.append(job)

    def release(self):
        for job in self.held:
            self.inner.submit_load(job)
        self.held = []

    def get_finished_jobs(self):
        return self.inner.get_finished_jobs()

    def drain(self, timeout=None):
        return self.inner.drain(timeout)

    def close(self):
        self.inner.close()

    def stats(self):
        return self.inner.stats()


def test_timed_out_promotion_quarantines_its_slot_until_the_late_report(harness):
    h = harness(4, tiers=[memory_tier(64)], job_timeout_s=5)
    stuck = _StuckTier(h.tiers[0])
    h.mgr._traffic.tiers[0].tier = stuck
    _seed_inner(h, stuck.inner, key(1))
    assert h.mgr.lookup(key(1)) is PENDING
    h.mgr.step()
    assert len(stuck.held) == 1
    h.clock.advance(6)
    h.mgr.step()
    stats = h.mgr.stats()
    assert stats["tiers"]["memory"]["timeouts"] == 1
    assert stats["pool"]["free"] == 3 and stats["pool"]["resident"] == 0  # quarantined
    # While quarantined the slot is never handed out, even under pressure.
    assert h.store([key(i) for i in range(10, 14)]) == []
    stored = [key(i) for i in range(10, 13)]
    assert h.store(stored) == stored
    stuck.release()  # the stuck read lands late, into the quarantined slot
    h.settle()
    stats = h.mgr.stats()["pool"]
    assert (stats["free"], stats["resident"]) == (1, 3)  # released after the report
    h.load_and_check(stored)  # the late read damaged nobody's bytes


class _NonVerifyingTier(SecondaryTier):
    verifies = False

    def lookup(self, key):
        return LookupResult.MISS

    def submit_store(self, job):
        pass

    def submit_load(self, job):
        pass

    def get_finished_jobs(self):
        return []

    def drain(self, timeout=None):
        return True

    def close(self):
        pass

    def stats(self):
        return TierStats()


def test_require_verified_tiers(harness):
    h = harness(4)
    tier = _NonVerifyingTier(TierContext(h.pool, h.namespace), {})
    with pytest.raises(KvtiersError, match="do not verify"):
        TieringOffloadingManager(4, LRUPolicy(4), [tier], require_verified_tiers=True)
    TieringOffloadingManager(4, LRUPolicy(4), [tier]).close()


def test_peer_store_job_pins_until_completed(harness):
    h = harness(2)
    h.store([key(1), key(2)])
    job = h.mgr.create_store_job([key(1)])
    assert job is not None and list(job.keys) == [key(1)]
    assert h.mgr.create_store_job([key(3)]) is None
    out = h.mgr.prepare_store([key(3), key(4)])
    assert out is None  # key(1) is pinned by the peer job: only one slot evictable
    h.mgr.complete_store_job(job.job_id)
    assert h.mgr.prepare_store([key(3), key(4)]) is not None


def test_reset_drops_unpinned(harness):
    h = harness(4)
    h.store([key(1), key(2)])
    h.mgr.prepare_load([key(1)])
    h.mgr.reset()
    assert h.mgr.lookup(key(1)) is HIT
    assert h.mgr.lookup(key(2)) is MISS
    h.mgr.complete_load([key(1)])


def test_stats_asks_tiers_outside_the_managers_lock(harness):
    """A tier whose stats() waits on a thread that calls into the manager (as a tier
    serving peers does under its own lock) must not deadlock stats()."""
    import threading

    from kvtiers.tiers.memory import MemoryTier

    box: dict[str, object] = {}

    class CallsBack(MemoryTier):
        serves_peers = True  # the manager then guards its state with a real lock

        def stats(self) -> TierStats:
            done = threading.Event()

            def peer() -> None:
                box["mgr"].lookup(key(1))  # type: ignore[attr-defined]
                done.set()

            threading.Thread(target=peer, daemon=True).start()
            box["answered"] = done.wait(5)
            return super().stats()

    spec = memory_tier(8)
    h = harness(4, tiers=[{"type": "memory", "name": "calls-back",
                           "factory": lambda ctx: CallsBack(ctx, spec["options"])}])
    box["mgr"] = h.mgr
    h.store([key(0)])
    assert "calls-back" in h.mgr.stats()["tiers"]
    assert box["answered"], "stats() held the manager's lock while asking the tier"


def test_prepare_store_never_evicts_a_key_of_the_call(harness):
    """issue 17: on a full pool, prepare_store([A, E]) with A resident evicted A (the
    least recently used) to make room for E; the engine, told A is present, would
    then load bytes that are gone. The call's own keys are never candidates."""
    h = harness(2)
    h.store([key(1)])
    h.store([key(2)])
    h.mgr.touch([key(2)])  # key 1 is the least recently used
    out = h.mgr.prepare_store([key(1), key(5)])
    assert out is not None and out.keys == [key(5)] and out.evicted == [key(2)]
    assert h.mgr.lookup(key(1)) is HIT
    h.load_and_check([key(1)])
    h.mgr.complete_store(out.keys, success=False)


def test_prepare_store_refuses_rather_than_evict_a_key_of_the_call(harness):
    h = harness(2)
    h.store([key(1), key(2)])
    h.mgr.prepare_load([key(2)])  # pinned by the engine
    assert h.mgr.prepare_store([key(1), key(5)]) is None
    assert h.mgr.stats()["pool"] == {**h.mgr.stats()["pool"], "resident": 2, "pinned": 1}
    h.mgr.complete_load([key(2)])
    h.load_and_check([key(1), key(2)])


def test_a_tier_receives_the_request_params(harness):
    from tests.manager.fake_tiers import ScriptedTier

    made: list[ScriptedTier] = []

    def build(ctx):
        made.append(ScriptedTier(ctx))
        return made[-1]

    h = harness(2, tiers=[{"type": "a", "factory": build}, {"type": "b", "factory": build}])
    params = {"do_remote_prefill": True, "remote_host": "10.0.0.7", "remote_block_ids": [3, 4]}
    h.mgr.on_request_start("r1", params)
    h.mgr.on_request_start("r2")
    for tier in made:
        assert tier.request_params == {"r1": params, "r2": None}
