"""`TieringOffloadingManager`: the scheduler-side bookkeeping of the CPU pool and the
secondary tiers below it.

Called from one thread (the scheduler's), once or more per step. It never waits for
disk, network or the GPU and never hashes block bytes: tier I/O runs on the tiers'
threads and is collected in `step()`. Every call costs O(1) per block.

Per block the pool keeps one policy entry (key -> slot) and, per slot, a state byte,
a flag byte and a hold count. A block with holds is pinned in the policy (never an
eviction candidate, never walked). Holds are taken by engine loads
(`prepare_load`), by a store or promotion in flight, by each queued or running
cascade, and by peer jobs (`create_store_job`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvtiers.clock import Clock, monotonic
from kvtiers.errors import KvtiersError
from kvtiers.jobs import TransferJob
from kvtiers.keys import BlockKey
from kvtiers.lookup import LookupResult
from kvtiers.manager.breaker import CircuitBreaker
from kvtiers.manager.events import OffloadEvent, PrefixLookup, PrepareStoreOutput
from kvtiers.manager.slot_state import DIRTY, FREE, LEAVING, PROMOTING, READY, STORING
from kvtiers.manager.tier_runtime import TierRuntime
from kvtiers.manager.tier_traffic import TierTraffic, _Job
from kvtiers.parent import ParentManager
from kvtiers.policies.base import EvictionPolicy
from kvtiers.slots import SlotAllocator
from kvtiers.tier import SecondaryTier

_log = logging.getLogger("kvtiers.manager")


WRITE_POLICIES = ("write_through", "write_back")


class TieringOffloadingManager(TierTraffic, ParentManager):
    """See the module docstring. `tiers` are built and owned by the caller (or by
    `kvtiers.manager.build.build_manager`); `close()` closes them."""

    def __init__(
        self,
        num_slots: int,
        policy: EvictionPolicy,
        tiers: Sequence[SecondaryTier] = (),
        *,
        write_policy: str = "write_through",
        clock: Clock = monotonic,
        job_timeout_s: float = 30.0,
        cascade_queue_blocks: int | None = None,
        max_job_blocks: int = 256,
        max_inflight_cascade_blocks: int = 1024,
        breaker_failures: int = 5,
        breaker_cooldown_s: float = 10.0,
        require_verified_tiers: bool = False,
        tier_names: Sequence[str] | None = None,
    ):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"write_policy must be one of {', '.join(WRITE_POLICIES)}, got {write_policy!r}"
            )
        if require_verified_tiers:
            unverified = [type(t).__name__ for t in tiers if not t.verifies]
            if unverified:
                raise KvtiersError(
                    f"require_verified_tiers is set but these tiers do not verify: "
                    f"{', '.join(unverified)}"
                )
        self.num_slots = num_slots
        self.write_policy = write_policy
        self._write_back = write_policy == "write_back" and bool(tiers)
        self._policy = policy
        self._get = policy.get
        self._clock = clock
        self._timeout = job_timeout_s
        self._max_job = max_job_blocks
        self._max_inflight = max_inflight_cascade_blocks
        self._alloc = SlotAllocator(num_slots)
        self._state = bytearray(num_slots)
        self._flags = bytearray(num_slots)
        self._holds = array("i", bytes(4 * num_slots))
        self._pinned = 0  # entries with holds > 0
        if cascade_queue_blocks is None:
            # Queued and running cascades of all tiers together pin at most half the pool.
            cascade_queue_blocks = max(1, min(4096, num_slots // (2 * max(1, len(tiers)))))
        names = list(tier_names) if tier_names else [type(t).__name__ for t in tiers]
        self._tiers = [
            TierRuntime(
                i,
                names[i],
                t,
                CircuitBreaker(clock, breaker_failures, breaker_cooldown_s),
                cascade_queue_blocks,
            )
            for i, t in enumerate(tiers)
        ]
        self._jobs: dict[int, _Job] = {}
        self._next_job_id = 1
        self._events: list[OffloadEvent] = []
        self._peer_jobs: dict[int, tuple[list[BlockKey], list[int]]] = {}
        self._closed = False
        self.counters = {
            "lookups": 0,
            "hits": 0,
            "misses": 0,
            "pending": 0,
            "retries": 0,
            "stored_blocks": 0,
            "store_failures": 0,
            "loaded_blocks": 0,
            "evictions": 0,
            "store_refused": 0,
        }
        serving = any(t.serves_peers for t in tiers)
        self._lock: Any = threading.RLock() if serving else contextlib.nullcontext()

    # ------------------------------------------------------------------ lookups

    def lookup(self, key: BlockKey) -> LookupResult:
        """Where `key` is: HIT (pool, readable now), HIT_PENDING, RETRY or MISS.
        A hit in a secondary tier reserves a slot and starts a promotion."""
        with self._lock:
            return self._lookup(key)

    def _lookup(self, key: BlockKey) -> LookupResult:
        c = self.counters
        c["lookups"] += 1
        slot = self._get(key)
        if slot is not None:
            if self._state[slot] == READY:
                c["hits"] += 1
                return LookupResult.HIT
            c["pending"] += 1
            return LookupResult.HIT_PENDING
        result = self._lookup_tiers(key)
        if result is LookupResult.MISS:
            c["misses"] += 1
        elif result is LookupResult.RETRY:
            c["retries"] += 1
        else:
            c["pending"] += 1
        return result

    def _lookup_tiers(self, key: BlockKey) -> LookupResult:
        retry = False
        for rt in self._tiers:
            if rt.stuck_blocks >= rt.queue_limit or not rt.breaker.allows():
                continue
            try:
                answer = rt.tier.lookup(key)
            except Exception:  # noqa: BLE001 - a tier's failure is a miss
                rt.counters.lookup_errors += 1
                _log.exception("tier %s: lookup raised; treating as a miss", rt.name)
                rt.breaker.failure()
                continue
            if answer is LookupResult.HIT:
                slot = self._reserve_one()
                if slot is None:
                    return LookupResult.MISS
                self._policy.insert(key, slot)
                self._state[slot] = PROMOTING
                self._hold(key, slot)
                rt.promotions.append((key, slot))
                return LookupResult.HIT_PENDING
            if answer is LookupResult.RETRY:
                retry = True
        return LookupResult.RETRY if retry else LookupResult.MISS

    def lookup_prefix(self, keys: Iterable[BlockKey]) -> PrefixLookup:
        """Scan a prefix until the first MISS: how many leading blocks are readable
        now, and whether asking again next step may find more (a promotion or probe
        is in flight). Promotions for the whole prefix start in this one call."""
        with self._lock:
            hits = 0
            leading = True
            retry = False
            lookup, get = self._lookup, self._get
            # A promotion started further on must not evict a block this call reports
            # as readable: once the scan first goes down to a tier, the leading hits
            # are held until it ends. (Pool-only scans take no holds at all.)
            leading_hits: list[tuple[BlockKey, int]] = []
            holding = False
            try:
                for key in keys:
                    if not holding and self._tiers and get(key) is None:
                        for k, s in leading_hits:
                            self._hold(k, s)
                        holding = True
                    r = lookup(key)
                    if r is LookupResult.HIT:
                        if leading:
                            hits += 1
                            leading_hits.append((key, get(key)))
                        continue
                    if r is LookupResult.MISS:
                        break
                    leading = False
                    retry = True
            finally:
                if holding:
                    for k, s in leading_hits:
                        self._release(k, s)
            return PrefixLookup(hits, retry)

    # ------------------------------------------------------------------ loads

    def prepare_load(self, keys: Sequence[BlockKey]) -> list[int]:
        """Pin the blocks (all must be HIT) and return their slots, in order."""
        with self._lock:
            get, state, hold = self._get, self._state, self._hold
            slots = []
            for key in keys:
                slot = get(key)
                if slot is None or state[slot] != READY:
                    # Undo the holds taken so far: the call has no effect.
                    for k, s in zip(keys, slots):
                        self._release(k, s)
                    raise KeyError(f"prepare_load: block {key.hex()} is not readable (not a HIT)")
                hold(key, slot)
                slots.append(slot)
            self.counters["loaded_blocks"] += len(slots)
            return slots

    def complete_load(self, keys: Sequence[BlockKey]) -> None:
        """The engine's loads of `keys` ended: unpin them."""
        with self._lock:
            get, release = self._get, self._release
            for key in keys:
                slot = get(key)
                if slot is not None:
                    release(key, slot)

    def touch(self, keys: Sequence[BlockKey]) -> None:
        """The blocks were used: refresh recency in the pool (and tiers that care)."""
        with self._lock:
            touch = self._policy.touch
            for key in keys:
                touch(key)
            for rt in self._tiers:
                if not rt.breaker.allows():
                    continue
                try:
                    rt.tier.touch(keys)
                except Exception:  # noqa: BLE001
                    _log.exception("tier %s: touch raised", rt.name)

    # ------------------------------------------------------------------ stores

    def prepare_store(self, keys: Sequence[BlockKey]) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not present, evicting unpinned blocks as
        needed. None (and nothing allocated) when the pool cannot take them now."""
        with self._lock:
            get = self._get
            new: list[BlockKey] = []
            seen: set[BlockKey] = set()
            for key in keys:
                if get(key) is None and key not in seen:
                    new.append(key)
                    seen.add(key)
            n = len(new)
            evicted: list[BlockKey] = []
            if n:
                free = self._alloc.free_count
                if free + (len(self._policy) - self._pinned) < n:
                    self.counters["store_refused"] += 1
                    return None
                if free < n:
                    self._evict(n - free, evicted)
                slots = self._alloc.allocate(n)
                if slots is None:
                    # Dirty victims are still being copied down (write_back): the
                    # engine may try again next step; the removals were announced.
                    self.counters["store_refused"] += 1
                    return None
            else:
                slots = []
            insert, state, hold = self._policy.insert, self._state, self._hold
            for key, slot in zip(new, slots):
                insert(key, slot)
                state[slot] = STORING
                hold(key, slot)
            return PrepareStoreOutput(new, slots, evicted)

    def complete_store(self, keys: Sequence[BlockKey], success: bool = True) -> None:
        """The GPU->pool copies of `keys` ended. On success they become readable and
        (write_through) are queued for the secondary tiers; on failure they go."""
        with self._lock:
            get, state, flags = self._get, self._state, self._flags
            stored: list[BlockKey] = []
            for key in keys:
                slot = get(key)
                if slot is None or state[slot] != STORING:
                    continue
                if success:
                    state[slot] = READY
                    stored.append(key)
                    if self._write_back:
                        flags[slot] = DIRTY
                    else:
                        for rt in self._tiers:
                            self._queue_cascade(rt, key, slot)
                    self._release(key, slot)
                else:
                    self._drop_reserved(key, slot)
            c = self.counters
            if success:
                c["stored_blocks"] += len(stored)
                if stored:
                    self._events.append(OffloadEvent("stored", stored))
            else:
                c["store_failures"] += len(keys)

    # ------------------------------------------------------------------ internals

    def _hold(self, key: BlockKey, slot: int) -> None:
        holds = self._holds
        if holds[slot] == 0:
            self._policy.pin(key)
            self._pinned += 1
        holds[slot] += 1

    def _release(self, key: BlockKey, slot: int) -> None:
        holds = self._holds
        n = holds[slot] - 1
        if n < 0:
            raise AssertionError(f"slot {slot}: hold count below zero")
        holds[slot] = n
        if n:
            return
        self._pinned -= 1
        if self._flags[slot] & LEAVING:  # a write_back eviction, done now
            self._policy.remove(key)
            self._free_slot(slot)
            self.counters["evictions"] += 1
            self._events.append(OffloadEvent("removed", [key]))
        else:
            self._policy.unpin(key)

    def _drop_reserved(self, key: BlockKey, slot: int) -> None:
        """Forget a block whose only hold was its (failed) store or promotion."""
        self._policy.remove(key)
        if self._holds[slot]:
            self._pinned -= 1
        self._holds[slot] = 0
        self._free_slot(slot)

    def _free_slot(self, slot: int) -> None:
        self._state[slot] = FREE
        self._flags[slot] = 0
        self._alloc.free((slot,))

    def _reserve_one(self) -> int | None:
        slot = self._alloc.allocate_one()
        if slot is None:
            evicted: list[BlockKey] = []
            self._evict(1, evicted)
            slot = self._alloc.allocate_one()
        return slot

    def _evict(self, n: int, evicted: list[BlockKey]) -> None:
        """Free up to `n` slots. Under write_back a dirty victim is copied down first
        (it stays pinned, flagged LEAVING, and is freed when its copies end)."""
        policy, flags = self._policy, self._flags
        freed = leaving = 0
        while freed + leaving < n:
            victims = policy.evict_items(n - freed - leaving)
            if not victims:
                break
            for key, slot in victims:
                if flags[slot] & DIRTY:
                    policy.insert(key, slot)
                    flags[slot] = LEAVING
                    queued = [self._queue_cascade(rt, key, slot) for rt in self._tiers]
                    if any(queued):
                        leaving += 1
                        continue
                    policy.remove(key)  # no tier took it: the block is dropped
                self._free_slot(slot)
                evicted.append(key)
                freed += 1
        if evicted:
            self.counters["evictions"] += len(evicted)
            self._events.append(OffloadEvent("removed", list(evicted)))

    # ------------------------------------------------------------------ peers

    def create_store_job(self, keys: Sequence[BlockKey]) -> TransferJob | None:
        with self._lock:
            get, state = self._get, self._state
            slots = []
            for key in keys:
                slot = get(key)
                if slot is None or state[slot] != READY:
                    return None
                slots.append(slot)
            # Built first: it refuses a repeated key before any hold is taken.
            job = TransferJob(self._next_job_id, list(keys), slots)
            self._next_job_id += 1
            for key, slot in zip(keys, slots):
                self._hold(key, slot)
            self._peer_jobs[job.job_id] = (list(job.keys), slots)
            return job

    def complete_store_job(self, job_id: int) -> None:
        with self._lock:
            entry = self._peer_jobs.pop(job_id, None)
            if entry is None:
                return
            for key, slot in zip(*entry):
                self._release(key, slot)

    # ------------------------------------------------------------------ requests

    def on_request_start(self, request_id: str, params: Mapping[str, Any] | None = None) -> None:
        """An engine request started; `params` (the engine's per-request transfer
        parameters, vLLM's `kv_transfer_params`) go to every tier."""
        for rt in self._tiers:
            try:
                rt.tier.on_request_start(request_id, params)
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: on_request_start raised", rt.name)

    def on_request_finished(self, request_id: str) -> None:
        for rt in self._tiers:
            try:
                rt.tier.on_request_finished(request_id)
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: on_request_finished raised", rt.name)

    # ------------------------------------------------------------------ misc

    def take_events(self) -> list[OffloadEvent]:
        """Stored/removed notifications since the last call (for KV-event routers)."""
        with self._lock:
            events, self._events = self._events, []
            return events

    def slot_of(self, key: BlockKey) -> int | None:
        """The slot of a resident block (tests, peers); None if absent."""
        return self._get(key)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            pool = dict(self.counters)
            pool.update(
                num_slots=self.num_slots,
                resident=len(self._policy),
                pinned=self._pinned,
                free=self._alloc.free_count,
            )
            ours = [(rt, {**vars(rt.counters), "breaker": rt.breaker.state.value,
                          "queued_cascades": len(rt.queue)}) for rt in self._tiers]
        # The tiers' own stats outside the manager's lock: a tier may take locks of
        # its own (one that serves peers calls back into the manager under them).
        tiers = {}
        for rt, counters in ours:
            try:
                tier_stats = rt.tier.stats().as_dict()
            except Exception:  # noqa: BLE001
                tier_stats = {}
            tiers[rt.name] = {**tier_stats, **counters}
        return {"pool": pool, "tiers": tiers}

    def reset(self) -> None:
        """Drop every block that is not pinned, and every queued cascade."""
        with self._lock:
            for rt in self._tiers:
                while rt.queue:
                    key, slot = rt.queue.popleft()
                    rt.counters.cascades_dropped += 1
                    self._release(key, slot)
            evicted: list[BlockKey] = []
            while True:
                victims = self._policy.evict_items(1024)
                if not victims:
                    break
                for key, slot in victims:
                    self._free_slot(slot)
                    evicted.append(key)
            if evicted:
                self._events.append(OffloadEvent("removed", evicted))

    def close(self) -> None:
        """Close every tier. The manager must not be used afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # Not under the lock: a tier's close may wait for its threads, which may be
        # serving a peer through this manager.
        for rt in self._tiers:
            try:
                rt.tier.close()
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: close raised", rt.name)
