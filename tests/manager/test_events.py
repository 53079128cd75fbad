"""Events name their tier, and are kept only when someone reads them.

The pool's own events are "cpu"; a cascade that lands in a secondary tier is a
"stored" event of that tier; a secondary tier reports removals through its
`ctx.events` and the manager names it; a promotion's "stored" in the pool names the
tier it came from (`source`).
"""

from __future__ import annotations

import os
import sys

from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.tier import TierContext
from kvtiers.manager import TieringOffloadingManager
from kvtiers.policies.lru import LRUPolicy

from tests.manager.conftest import BLOCK, key, memory_tier
from tests.manager.fake_tiers import ScriptedTier


def scripted(name: str, made: list[ScriptedTier]) -> dict[str, object]:
    def build(ctx: TierContext) -> ScriptedTier:
        made.append(ScriptedTier(ctx))
        return made[-1]

    return {"type": name, "factory": build}


def view(events):
    return [(e.kind, e.tier, e.source, sorted(e.keys)) for e in events]


def _store_and_evict(mgr: TieringOffloadingManager, first: bytes) -> None:
    """Store `first`, then enough other blocks that it is evicted long ago."""
    for i in range(50):
        out = mgr.prepare_store([first if i == 0 else key(1000 + i)])
        assert out is not None
        mgr.complete_store(out.keys)
        mgr.step()


def test_events_are_off_by_default_and_nothing_is_kept():
    mgr = TieringOffloadingManager(4, LRUPolicy.for_slots(4))
    assert not mgr.events_enabled
    first = bytes(key(0))  # an object of its own, to count references to
    baseline = sys.getrefcount(first)
    _store_and_evict(mgr, first)
    assert mgr.stats()["pool"]["evictions"] == 46
    # Evicted, and no pending event keeps it alive.
    assert sys.getrefcount(first) == baseline
    assert mgr._events.pending() == [] and mgr.take_events() == []


def test_events_on_keep_what_the_engine_has_not_taken():
    mgr = TieringOffloadingManager(4, LRUPolicy.for_slots(4), enable_events=True)
    first = bytes(key(0))
    baseline = sys.getrefcount(first)
    _store_and_evict(mgr, first)
    assert sys.getrefcount(first) == baseline + 2  # its stored and its removed event
    events = mgr.take_events()
    assert len(events) == 50 + 46 and mgr.take_events() == []
    del events
    assert sys.getrefcount(first) == baseline


def test_enabled_later_events_start_then(harness):
    h = harness(2, enable_events=False)
    h.store([key(1)])
    assert h.mgr.take_events() == []
    h.mgr.enable_events()
    assert h.mgr.events_enabled
    h.store([key(2), key(3)])  # evicts key 1
    assert view(h.mgr.take_events()) == [
        ("removed", "cpu", None, [key(1)]), ("stored", "cpu", None, sorted([key(2), key(3)])),
    ]  # fmt: skip


def test_cascades_and_promotions_name_their_tier(harness):
    made: list[ScriptedTier] = []
    h = harness(2, tiers=[scripted("near", made), scripted("far", made)])
    near, far = made
    h.store([key(1)])
    h.settle()
    assert view(h.mgr.take_events()) == [
        ("stored", "cpu", None, [key(1)]),
        ("stored", "near", None, [key(1)]),
        ("stored", "far", None, [key(1)]),
    ]
    # A block only the second tier has comes back from there, and says so.
    data = os.urandom(BLOCK)
    far.put(key(5), data)
    h.content[key(5)] = data
    assert h.lookup_until_settled(key(5)) is LookupResult.HIT
    assert view(h.mgr.take_events()) == [("stored", "cpu", "far", [key(5)])]
    h.load_and_check([key(5)])
    assert h.mgr.stats()["tiers"]["far"]["promoted_hits"] == 1


def test_a_failed_cascade_is_no_stored_event(harness):
    made: list[ScriptedTier] = []
    h = harness(2, tiers=[scripted("near", made)])
    made[0].fail = True
    h.store([key(1)])
    h.settle()
    assert view(h.mgr.take_events()) == [("stored", "cpu", None, [key(1)])]
    assert h.mgr.stats()["tiers"]["near"]["cascade_failures"] == 1


def test_a_tiers_removals_become_its_removed_events(harness):
    made: list[ScriptedTier] = []
    h = harness(2, tiers=[scripted("near", made), scripted("far", made)])
    near, far = made
    assert near.ctx.events.enabled and far.ctx.events.enabled  # turned on by the manager
    h.mgr.take_events()
    far.ctx.events.removed([key(7), key(8)])  # from any thread, whenever it happens
    near.ctx.events.removed([key(9)])
    assert view(h.mgr.take_events()) == [
        ("removed", "near", None, [key(9)]), ("removed", "far", None, sorted([key(7), key(8)])),
    ]  # fmt: skip
    far.ctx.events.removed([key(6)])
    h.mgr.step()  # a step collects them too
    assert view(h.mgr.take_events()) == [("removed", "far", None, [key(6)])]
    assert h.mgr.take_events() == []


def test_with_events_off_a_tiers_removals_are_not_kept(harness):
    made: list[ScriptedTier] = []
    h = harness(2, tiers=[scripted("near", made)], enable_events=False)
    events = made[0].ctx.events
    assert not events.enabled
    events.removed([key(1)])
    assert events.take() == [] and h.mgr.take_events() == []
    h.mgr.enable_events()  # the tiers' reporters are turned on with the manager's events
    events.removed([key(2)])
    assert view(h.mgr.take_events()) == [("removed", "near", None, [key(2)])]


def test_a_removal_is_collected_before_the_steps_results(harness):
    """A tier drops a block and a new copy of it lands before the next step: the
    router must end up seeing it as stored, so removals come first."""
    made: list[ScriptedTier] = []
    h = harness(2, tiers=[scripted("near", made)])
    h.mgr.take_events()
    made[0].ctx.events.removed([key(1)])  # an old copy went
    h.store([key(1)])  # the new copy is cascaded in this step
    h.settle()
    assert view(h.mgr.take_events()) == [
        ("stored", "cpu", None, [key(1)]),
        ("removed", "near", None, [key(1)]),
        ("stored", "near", None, [key(1)]),
    ]


def test_the_memory_tiers_reporter_is_watched(harness):
    h = harness(2, tiers=[memory_tier(4)])
    assert h.tiers[0].ctx.events.enabled
