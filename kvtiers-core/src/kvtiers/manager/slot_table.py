"""`SlotTable`: the scheduler side's picture of the CPU pool.

Per resident block one policy entry (key -> slot); per slot a state byte (`FREE`,
`STORING`, `READY`, `PROMOTING`, `QUARANTINED`), a flag byte (`DIRTY`, `LEAVING`:
write_back) and a hold count. A block with holds is pinned in the policy: never an
eviction candidate, never walked. The table owns all of it; others read `state`,
`flags` and `holds` through read-only views and change them only through its methods.

Who holds: engine loads and stores in flight, promotions, each queued or running
cascade, peer jobs. Holds are counted here and nowhere else; the policy's pin is the
boolean "has holds".

Scheduler thread only (callers serialise, the manager under its lock). Every method
costs O(1) per block it is given or removes; nothing blocks.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import cast

from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.contract.keys import BlockKey
from kvtiers.manager import slotops
from kvtiers.manager.event_log import EventLog
from kvtiers.manager.outputs import PrepareStoreOutput
from kvtiers.manager.slot_state import (
    DIRTY,
    FREE,
    LEAVING,
    PROMOTING,
    QUARANTINED,
    READY,
    STORING,
)
from kvtiers.manager.slots import SlotAllocator
from kvtiers.policies import slot_links

_READY_BYTE = bytes((READY,))
_STORING_BYTE = bytes((STORING,))

#: `copy_down(key, slot)`: queue a dirty victim's copy to the secondary tiers (taking
#: holds); False when no tier took it. Only called under write_back.
CopyDown = Callable[[BlockKey, int], bool]
#: `cascade(key, slot)`: queue a just-stored block's copies (write_through).
Cascade = Callable[[BlockKey, int], object]


class SlotTable:
    """See the module docstring. `events` gets the pool's removals (tier "cpu")."""

    def __init__(
        self,
        num_slots: int,
        policy: EvictionPolicy,
        events: EventLog,
        *,
        write_back: bool = False,
    ):
        self.num_slots = num_slots
        self.write_back = write_back
        self._policy = policy
        self._events = events
        self._alloc = SlotAllocator(num_slots)
        self._state = bytearray(num_slots)
        self._flags = bytearray(num_slots)
        self._holds = array("i", bytes(4 * num_slots))
        self._pinned = 0  # slots with holds > 0
        self._evictions = 0
        # Read-only views: as fast to index as the arrays themselves.
        self.state = memoryview(self._state).toreadonly()
        self.flags = memoryview(self._flags).toreadonly()
        self.holds = memoryview(self._holds).toreadonly()
        #: the slot of a resident key (any state), else None; bound once (hot path)
        self.get: Callable[[BlockKey], int | None] = policy.get
        # The per-block loops over holds and states: C when built, else Python.
        self._hold_many, self._release_many, self._fill = slotops.functions()
        # bytes of a per-slot array at given slots (C with the policies' helper).
        self._gather = slot_links.gather_function()

    # ------------------------------------------------------------------ reading

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy (read it; change it only through the table)."""
        return self._policy

    @property
    def pinned(self) -> int:
        """Resident blocks with holds."""
        return self._pinned

    @property
    def evictions(self) -> int:
        """Blocks evicted so far (a write_back victim counts when it finally goes)."""
        return self._evictions

    @property
    def free_count(self) -> int:
        return self._alloc.free_count

    def __len__(self) -> int:
        """Resident blocks."""
        return len(self._policy)

    def ready_by_use(self) -> list[tuple[BlockKey, int]]:
        """Every READY block `(key, slot)` in the policy's eviction order (its
        `export`: the next victim first, pinned blocks last). O(resident): for tools
        (a snapshot of the pool), never a step's work."""
        get, state = self.get, self._state
        out = []
        for key in self._policy.export():
            slot = get(key)
            if slot is not None and state[slot] == READY:
                out.append((key, slot))
        return out

    def scan_prefix(self, keys: Sequence[BlockKey]) -> tuple[int, int, int]:
        """The pool-only prefix scan: `(resident, leading, ready)` where `resident` is
        how many leading keys are resident (the scan stops at the first absent one),
        `leading` how many of those lead READY, `ready` how many of them are READY.
        Takes no holds. O(1) per key, in C loops: every key of `keys` is looked up
        once (the ones after the first absent key too: a prompt's misses are its
        tail, so that costs little and saves a Python loop per block)."""
        found = list(map(self.get, keys))
        try:
            resident = found.index(None)
            del found[resident:]
        except ValueError:
            resident = len(found)
        if not resident:
            return 0, 0, 0
        slots = cast("list[int]", found)  # every None is gone
        states = self._gather(self._state, slots)
        ready = states.count(_READY_BYTE)
        if ready == resident:
            return resident, resident, resident
        return resident, resident - len(states.lstrip(_READY_BYTE)), ready

    # ------------------------------------------------------------------ holds

    def hold(self, key: BlockKey, slot: int) -> None:
        holds = self._holds
        if holds[slot] == 0:
            self._policy.pin(key)
            self._pinned += 1
        holds[slot] += 1

    def release(self, key: BlockKey, slot: int) -> None:
        """Drop one hold. The last hold of a LEAVING block (write_back, copied down)
        evicts it now."""
        holds = self._holds
        n = holds[slot] - 1
        if n < 0:
            raise AssertionError(f"slot {slot}: hold count below zero")
        holds[slot] = n
        if n:
            return
        self._pinned -= 1
        if self._flags[slot] & LEAVING:
            self._policy.remove(key)
            self._free_slot(slot)
            self._evictions += 1
            self._events.removed([key])
        else:
            self._policy.unpin(key)

    def hold_readable(self, keys: Sequence[BlockKey]) -> list[int]:
        """Hold every block of `keys` (all must be READY) and return their slots, in
        order; `KeyError` (and no hold taken) when one is not."""
        slots = list(map(self.get, keys))
        if None in slots or self._gather(self._state, slots).count(  # type: ignore[arg-type]
            _READY_BYTE
        ) != len(slots):
            for key, slot in zip(keys, slots, strict=True):
                if slot is None or self._state[slot] != READY:
                    raise KeyError(f"prepare_load: block {key.hex()} is not readable (not a HIT)")
        ready = cast("list[int]", slots)
        keys = keys if type(keys) is list else list(keys)
        fresh = self._hold_many(self._holds, keys, ready)  # pinned in the policy now
        if fresh:
            self._pinned += len(fresh)
            self._policy.pin_many(fresh)
        return ready

    def release_keys(self, keys: Iterable[BlockKey]) -> None:
        """Drop one hold of each resident key of `keys`; others are ignored."""
        if self.write_back:  # a last hold may evict a LEAVING block: one by one
            get, release = self.get, self.release
            for key in keys:
                slot = get(key)
                if slot is not None:
                    release(key, slot)
            return
        keys = keys if type(keys) is list else list(keys)
        self._release_all(keys, list(map(self.get, keys)))

    def release_held(self, keys: list[BlockKey], slots: list[int]) -> None:
        """Drop one hold of each (key, slot) pair, in order: the slots their holds
        were taken on (`hold_readable`)."""
        if self.write_back:  # a last hold may evict a LEAVING block: one by one
            release = self.release
            for key, slot in zip(keys, slots, strict=True):
                release(key, slot)
            return
        self._release_all(keys, cast("list[int | None]", slots))

    def _release_all(self, keys: list[BlockKey], slots: list[int | None]) -> None:
        """`release` for each (key, slot) pair with a slot, in order; no block is
        LEAVING (write_through: nothing is ever copied down on eviction)."""
        last = self._release_many(self._holds, keys, slots)  # candidates again
        if last:
            self._pinned -= len(last)
            self._policy.unpin_many(last)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        self._policy.touch_many(keys)

    # ------------------------------------------------------------------ stores

    def prepare_store(
        self, keys: Sequence[BlockKey], copy_down: CopyDown
    ) -> PrepareStoreOutput | None:
        """Slots (state STORING, held) for the keys of `keys` not resident, evicting
        unpinned blocks as needed but never a block of `keys` itself. None, and
        nothing allocated, when the pool cannot take them now: too few candidates
        (nothing evicted then), or dirty victims still being copied down (write_back:
        those evicted meanwhile are announced)."""
        found = list(map(self.get, keys))
        if None not in found:
            return PrepareStoreOutput([], [], [])
        absent = [key for key, slot in zip(keys, found, strict=True) if slot is None]
        present = len(absent) < len(found)
        new = list(dict.fromkeys(absent))  # each key once, in call order
        n = len(new)
        if not n:
            return PrepareStoreOutput(new, [], [])
        evicted: list[BlockKey] = []
        free = self._alloc.free_count
        if free < n:
            policy = self._policy
            # The call's own resident blocks without holds are pinned in the policy
            # (no hold: nothing else looks while victims are chosen) so that none of
            # them is a victim; unpinned again, they are the most recently used.
            protect = self._unpinned(keys) if present else []
            if free + len(policy) - self._pinned - len(protect) < n:
                return None
            if protect:
                for key in protect:
                    policy.pin(key)
                try:
                    self._evict(n - free, evicted, copy_down)
                finally:
                    for key in protect:
                        policy.unpin(key)
            else:
                self._evict(n - free, evicted, copy_down)
        slots = self._alloc.allocate(n)
        if slots is None:
            return None
        # Each new block: in the policy pinned (the store's hold), STORING, one hold.
        self._policy.insert_pinned(new, slots)
        self._fill(self._state, slots, STORING)
        self._hold_many(self._holds, new, slots)  # free slots: 0 -> 1
        self._pinned += n
        return PrepareStoreOutput(new, slots, evicted)

    def _unpinned(self, keys: Iterable[BlockKey]) -> list[BlockKey]:
        """The resident keys of `keys` whose blocks have no holds, each once."""
        get, holds = self.get, self._holds
        found: dict[BlockKey, None] = {}
        for key in keys:
            slot = get(key)
            if slot is not None and holds[slot] == 0:
                found[key] = None
        return list(found)

    def finish_stores(self, keys: Iterable[BlockKey], cascade: Cascade | None) -> list[BlockKey]:
        """The engine's copies of `keys` succeeded: the STORING ones become READY
        (write_back: and DIRTY; write_through: `cascade(key, slot)` queues their copies
        before the store's hold goes). Returns the keys that became readable."""
        if cascade is None and not self.write_back:
            return self._finish_stores_pool_only(keys)
        get, state, flags, release = self.get, self._state, self._flags, self.release
        write_back = self.write_back
        stored: list[BlockKey] = []
        for key in keys:
            slot = get(key)
            if slot is None or state[slot] != STORING:
                continue
            state[slot] = READY
            stored.append(key)
            if write_back:
                flags[slot] = DIRTY
            elif cascade is not None:
                cascade(key, slot)
            release(key, slot)
        return stored

    def _finish_stores_pool_only(self, keys: Iterable[BlockKey]) -> list[BlockKey]:
        """`finish_stores` with nothing to cascade or mark dirty: the STORING blocks
        become READY and their store holds go, in one pass."""
        keys = keys if type(keys) is list else list(keys)
        state = self._state
        found = list(map(self.get, keys))
        if (
            None not in found
            and self._gather(state, found).count(_STORING_BYTE) == len(found)  # type: ignore[arg-type]
            and len(set(found)) == len(found)
        ):  # the common case: each key once, all being stored
            ready = cast("list[int]", found)
            self._fill(state, ready, READY)
            self._release_all(keys, found)
            return keys
        stored: list[BlockKey] = []
        slots: list[int | None] = []
        for key, slot in zip(keys, found, strict=True):
            if slot is None or state[slot] != STORING:
                continue
            state[slot] = READY
            stored.append(key)
            slots.append(slot)
        self._release_all(stored, slots)
        return stored

    def fail_stores(self, keys: Iterable[BlockKey]) -> None:
        """The engine's copies of `keys` failed: the STORING ones are forgotten."""
        get, state = self.get, self._state
        for key in keys:
            slot = get(key)
            if slot is not None and state[slot] == STORING:
                self.drop_reserved(key, slot)

    # ------------------------------------------------------------------ promotions

    def reserve_promotion(self, key: BlockKey, copy_down: CopyDown) -> int | None:
        """A held PROMOTING slot for `key` (not resident), evicting one block if the
        pool is full; None when no slot can be had now."""
        slot = self._alloc.allocate_one()
        if slot is None:
            evicted: list[BlockKey] = []
            self._evict(1, evicted, copy_down)
            slot = self._alloc.allocate_one()
            if slot is None:
                return None
        self._policy.insert(key, slot)
        self._state[slot] = PROMOTING
        self.hold(key, slot)
        return slot

    def land(self, key: BlockKey, slot: int) -> None:
        """A promotion's bytes are in `slot`: readable, and the promotion's hold goes."""
        self._state[slot] = READY
        self.release(key, slot)

    def quarantine(self, key: BlockKey, slot: int) -> None:
        """A promotion timed out: `key` is a miss now, but its slot is not reused
        until the tier reports (a stuck read may still land in it)."""
        self._policy.remove(key)
        if self._holds[slot]:
            self._pinned -= 1
        self._holds[slot] = 0
        self._state[slot] = QUARANTINED
        self._flags[slot] = 0

    def free_quarantined(self, slot: int) -> None:
        """The tier reported the timed-out promotion of `slot`: it may be reused."""
        if self._state[slot] == QUARANTINED:
            self._free_slot(slot)

    # ------------------------------------------------------------------ removal

    def drop_reserved(self, key: BlockKey, slot: int) -> None:
        """Forget a block whose only hold was its (failed) store or promotion."""
        self._policy.remove(key)
        if self._holds[slot]:
            self._pinned -= 1
        self._holds[slot] = 0
        self._free_slot(slot)

    def clear(self) -> None:
        """Drop every block that has no holds (announced as removed)."""
        evicted: list[BlockKey] = []
        while True:
            victims = self._victims(1024)
            if not victims:
                break
            for key, slot in victims:
                self._free_slot(slot)
                evicted.append(key)
        self._events.removed(evicted)

    def _victims(self, n: int) -> list[tuple[BlockKey, int]]:
        return cast("list[tuple[BlockKey, int]]", self._policy.evict_items(n))

    def _free_slot(self, slot: int) -> None:
        self._state[slot] = FREE
        self._flags[slot] = 0
        self._alloc.free((slot,))

    def _evict(self, n: int, evicted: list[BlockKey], copy_down: CopyDown) -> None:
        """Free up to `n` slots, naming the blocks removed in `evicted` (empty when
        called). Under write_back a dirty victim is copied down first: it stays,
        held by its copies and flagged LEAVING, and goes when they end."""
        policy, flags = self._policy, self._flags
        if not self.write_back:  # nothing is dirty: every victim goes now, in one batch
            victims = self._victims(n)
            if victims:
                slots = [slot for _, slot in victims]
                self._fill(self._state, slots, FREE)
                self._fill(flags, slots, 0)
                self._alloc.free(slots)
                evicted.extend(key for key, _ in victims)
                self._evictions += len(evicted)
                self._events.removed(list(evicted))
            return
        freed = leaving = 0
        while freed + leaving < n:
            victims = self._victims(n - freed - leaving)
            if not victims:
                break
            for key, slot in victims:
                if flags[slot] & DIRTY:
                    policy.insert(key, slot)
                    flags[slot] = LEAVING
                    if copy_down(key, slot):
                        leaving += 1
                        continue
                    policy.remove(key)  # no tier took it: the block is dropped
                self._free_slot(slot)
                evicted.append(key)
                freed += 1
        if evicted:
            self._evictions += len(evicted)
            self._events.removed(list(evicted))
