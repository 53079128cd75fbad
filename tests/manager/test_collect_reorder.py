"""`TieringOffloadingManager.collect` (the tiers' finished jobs collected, nothing
submitted) and `reorder` (recency by request, tiers told unless asked not to), with
a scripted tier whose jobs end when the test says."""

from __future__ import annotations

import os

from kvtiers.contract.lookup import LookupResult
from kvtiers.policies.slot_lru import SlotLRUPolicy

from tests.manager.conftest import BLOCK, key
from tests.manager.fake_tiers import ScriptedTier


def test_a_promotion_that_ended_lands_at_collect(harness) -> None:
    """A promotion submitted at one step's end lands at the next step's `collect`
    (the engine's first lookup), one step before `step()` would land it; `collect`
    submits nothing: a promotion asked for after it waits for `step()`."""
    tiers: list[ScriptedTier] = []

    def make(ctx):
        tiers.append(ScriptedTier(ctx, hold=True))
        return tiers[0]

    h = harness(8, tiers=[{"type": "scripted", "factory": make}])
    tier = tiers[0]
    a, b = key(1), key(2)
    for k in (a, b):
        tier.put(k, os.urandom(BLOCK))
        h.content[k] = tier.data[k]
    assert h.mgr.lookup(a) is LookupResult.HIT_PENDING
    h.mgr.step()  # submitted
    assert tier.calls["submit_load"] == 1
    tier.release()  # the tier's I/O ended between two steps
    assert h.mgr.lookup(a) is LookupResult.HIT_PENDING  # not collected yet
    h.mgr.collect()
    assert h.mgr.lookup(a) is LookupResult.HIT
    h.load_and_check([a])
    assert h.mgr.lookup(b) is LookupResult.HIT_PENDING
    h.mgr.collect()  # nothing ran: nothing submitted, nothing lands
    assert tier.calls["submit_load"] == 1
    assert h.mgr.lookup(b) is LookupResult.HIT_PENDING
    h.mgr.step()
    tier.release()
    h.mgr.collect()
    h.load_and_check([b])


def test_reorder_tells_the_tiers_unless_asked_not_to(harness) -> None:
    tiers: list[ScriptedTier] = []

    def make(ctx):
        tiers.append(ScriptedTier(ctx))
        return tiers[0]

    policy = SlotLRUPolicy.for_slots(4)
    assert policy.keep_pinned_in_place()
    h = harness(4, tiers=[{"type": "scripted", "factory": make}], policy=policy)
    keys = [key(i) for i in range(4)]
    h.store(keys)
    h.mgr.reorder(keys[::-1], tiers=False)  # placing: the tiers are not told
    assert tiers[0].touched == []
    h.mgr.reorder(keys[::-1], used=set(keys[:1]))
    assert tiers[0].touched == [keys[::-1]]
    # The head, reordered last, is the newest: a store evicts the tail first.
    h.settle()
    out = h.mgr.prepare_store([key(9)])
    assert out is not None and out.evicted == [keys[3]]
