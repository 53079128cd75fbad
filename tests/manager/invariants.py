"""Structural invariants of a `TieringOffloadingManager`, checked from the outside in
(policy entries, slot states, hold counts, flags, queues and jobs), for the stateful
test and the threaded tests. Reads internals on purpose: these are the invariants the
manager's docstring promises about them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvtiers.contract.pool_view import PoolView
from kvtiers.manager import TieringOffloadingManager
from kvtiers.manager.slot_state import (
    DIRTY,
    FREE,
    LEAVING,
    PROMOTING,
    QUARANTINED,
    READY,
    STORING,
)

Content = Callable[[bytes], bytes] | Mapping[bytes, bytes]


@dataclass
class PoolPicture:
    """What the checker saw: resident key -> slot, and slots by state."""

    resident: dict[bytes, int] = field(default_factory=dict)
    free: set[int] = field(default_factory=set)
    quarantined: set[int] = field(default_factory=set)

    def state_of(self, mgr: TieringOffloadingManager, key: bytes) -> int | None:
        slot = self.resident.get(key)
        return None if slot is None else mgr._slots.state[slot]

    def ready_keys(self, mgr: TieringOffloadingManager) -> set[bytes]:
        return {k for k, s in self.resident.items() if mgr._slots.state[s] == READY}


def check_structure(
    mgr: TieringOffloadingManager, pool: PoolView | None = None, content: Content | None = None
) -> PoolPicture:
    """Assert every structural invariant; with `pool` and `content`, also that each
    READY slot holds exactly the bytes stored for its key."""
    policy, n = mgr._slots.policy, mgr.num_slots
    state, holds, flags = mgr._slots.state, mgr._slots.holds, mgr._slots.flags
    pic = PoolPicture()

    # Each resident key owns one slot, and no slot is owned twice.
    keys = list(policy.export())
    assert len(keys) == len(set(keys)) == len(policy), "policy export disagrees with len()"
    owner: dict[int, bytes] = {}
    for key in keys:
        slot = policy.get(key)
        assert isinstance(slot, int) and 0 <= slot < n, f"{key.hex()} -> bad slot {slot!r}"
        assert slot not in owner, f"slot {slot} owned by {owner[slot].hex()} and {key.hex()}"
        owner[slot] = key
        pic.resident[key] = slot

    alloc = mgr._slots._alloc
    free_list = list(alloc._free)
    assert len(free_list) == len(set(free_list)) == alloc.free_count, "free list duplicate"
    pic.free = set(free_list)
    pinned = 0
    for slot in range(n):
        s = state[slot]
        if slot in owner:
            assert slot not in pic.free, f"resident slot {slot} is also free"
            assert s in (READY, STORING, PROMOTING), f"resident slot {slot} in state {s}"
            pinned_in_policy = policy.is_pinned(owner[slot])
            assert bool(holds[slot]) == pinned_in_policy, (
                f"slot {slot}: {holds[slot]} holds but policy pinned={pinned_in_policy}"
            )
            if s in (STORING, PROMOTING):
                assert holds[slot] >= 1, f"slot {slot} is being written but not pinned"
        elif slot in pic.free:
            assert s == FREE, f"free slot {slot} in state {s}"
        else:
            assert s == QUARANTINED, f"slot {slot} is neither free, resident nor quarantined ({s})"
            pic.quarantined.add(slot)
        if s in (FREE, QUARANTINED):
            what = "free" if s == FREE else "quarantined"
            assert holds[slot] == 0, f"{what} slot {slot} has holds"
            assert flags[slot] == 0, f"slot {slot} in state {s} has flags {flags[slot]}"
        assert holds[slot] >= 0
        pinned += holds[slot] > 0
        f = flags[slot]
        assert not (f & DIRTY and f & LEAVING), f"slot {slot} both dirty and leaving"
        if f:
            assert s == READY, f"slot {slot} flagged {f} in state {s}"
            assert mgr._slots.write_back, f"slot {slot} flagged {f} under write_through"
        if f & LEAVING:
            assert holds[slot] > 0, f"leaving slot {slot} has no holds: it should be free"
    assert mgr._slots.pinned == pinned, f"_pinned={mgr._slots.pinned}, slots with holds={pinned}"

    # Queued cascades, promotions and jobs point at the slots they hold.
    for rt in mgr._traffic.tiers:
        for key, slot in rt.queue:
            assert owner.get(slot) == key, f"queued cascade {key.hex()}@{slot} not resident"
            assert state[slot] == READY, f"queued cascade of slot {slot} in state {state[slot]}"
        for key, slot in rt.promotions:
            assert owner.get(slot) == key and state[slot] == PROMOTING, f"promotion {slot}"
        assert len(rt.queue) + rt.inflight_cascade_blocks <= rt.queue_limit, (
            f"tier {rt.name}: {len(rt.queue)} queued + {rt.inflight_cascade_blocks} running "
            f"cascades exceed the bound {rt.queue_limit}"
        )
    timed_out_promotions: set[int] = set()
    for job in mgr._traffic.jobs.values():
        if job.kind == "promote":
            if job.timed_out:
                timed_out_promotions.update(job.slots)
            else:
                for key, slot in zip(job.keys, job.slots, strict=True):
                    assert owner.get(slot) == key and state[slot] == PROMOTING, f"promotion {slot}"
        else:
            for key, slot in zip(job.keys, job.slots, strict=True):
                assert owner.get(slot) == key, f"cascade of {key.hex()}@{slot}: slot reused"
    assert timed_out_promotions == pic.quarantined, (
        f"quarantined {sorted(pic.quarantined)} but timed-out promotions hold "
        f"{sorted(timed_out_promotions)}"
    )

    if pool is not None and content is not None:
        get = content.get if isinstance(content, Mapping) else content
        for key, slot in pic.resident.items():
            if state[slot] == READY:
                assert bytes(pool.block(slot)) == get(key), (
                    f"READY block {key.hex()} in slot {slot} does not hold its stored bytes"
                )

    stats = mgr.stats()["pool"]
    assert (stats["pinned"], stats["free"], stats["resident"]) == (
        pinned, len(pic.free), len(pic.resident),
    ), f"stats() disagree: {stats}"
    return pic


def manager_holds(mgr: TieringOffloadingManager) -> Counter[int]:
    """Holds the manager itself takes: promotions reserved or running, cascades
    queued or running (timed-out cascades keep theirs until the tier reports)."""
    held: Counter[int] = Counter()
    for rt in mgr._traffic.tiers:
        held.update(slot for _, slot in rt.promotions)
        held.update(slot for _, slot in rt.queue)
    for job in mgr._traffic.jobs.values():
        if job.kind == "cascade" or not job.timed_out:
            held.update(job.slots)
    return held


def check_holds(mgr: TieringOffloadingManager, engine: Mapping[int, int]) -> None:
    """Every slot's hold count is exactly the engine's holds (loads, stores in
    flight, peer jobs: slot -> count) plus the manager's own (see `manager_holds`)."""
    expected = manager_holds(mgr)
    expected.update(engine)
    holds = mgr._slots.holds
    actual = {slot: holds[slot] for slot in range(mgr.num_slots) if holds[slot]}
    expected_nonzero = {slot: n for slot, n in expected.items() if n}
    assert actual == expected_nonzero, f"holds {actual} != expected {expected_nonzero}"
