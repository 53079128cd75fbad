"""`TieringOffloadingManager`: the scheduler-side bookkeeping of the CPU pool and the
secondary tiers below it.

Called from one thread (the scheduler's), once or more per step. It never waits for
disk, network or the GPU and never hashes block bytes: tier I/O runs on the tiers'
threads and is collected in `step()`. Every call costs O(1) per block.

It is composed of small objects, each the owner of its state:

- `SlotTable` (slot_table.py): the pool's policy entries, slot states, flags and
  hold counts (a block with holds is pinned: never an eviction candidate);
- `TierTraffic` (tier_traffic.py): the tiers, their breakers and cascade queues, the
  jobs given to them;
- `PeerJobs` (peer_jobs.py): blocks held for a peer-serving tier;
- `EventLog` (event_log.py): stored/removed events, off unless enabled.

The manager serialises them (a real lock only when a tier serves peers from its own
threads), counts the engine's calls, and keeps the order of their effects.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvtiers.contract.clock import Clock, monotonic
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.contract.jobs import TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.parent import ParentManager
from kvtiers.contract.tier import SecondaryTier
from kvtiers.errors import KvtiersError
from kvtiers.manager.event_log import EventLog
from kvtiers.manager.outputs import OffloadEvent, PrefixLookup, PrepareStoreOutput
from kvtiers.manager.peer_jobs import PeerJobs
from kvtiers.manager.slot_state import READY
from kvtiers.manager.slot_table import SlotTable
from kvtiers.manager.tier_traffic import TierTraffic

if TYPE_CHECKING:
    from kvtiers.admission.base import AdmissionPolicy

WRITE_POLICIES = ("write_through", "write_back")


class TieringOffloadingManager(ParentManager):
    """See the module docstring. `tiers` are built and owned by the caller (or by
    `kvtiers.manager.build.build_manager`); `close()` closes them.

    `enable_events`: keep stored/removed events for `take_events()` (a cache-aware
    router reads them); off, nothing is kept. `enable_events()` turns them on later."""

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
        enable_events: bool = False,
        admissions: Sequence[AdmissionPolicy | None] | None = None,
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
        if cascade_queue_blocks is None:
            # Queued and running cascades of all tiers together pin at most half the pool.
            cascade_queue_blocks = max(1, min(4096, num_slots // (2 * max(1, len(tiers)))))
        names = list(tier_names) if tier_names else [type(t).__name__ for t in tiers]
        self._events = EventLog(enable_events)
        self._slots = SlotTable(
            num_slots, policy, self._events, write_back=write_policy == "write_back" and bool(tiers)
        )
        next_id = itertools.count(1).__next__  # job ids: tier jobs and peer jobs alike
        self._traffic = TierTraffic(
            tiers, names, self._slots, self._events, next_id,
            clock=clock, job_timeout_s=job_timeout_s, queue_limit=cascade_queue_blocks,
            max_job_blocks=max_job_blocks, max_inflight_cascade_blocks=max_inflight_cascade_blocks,
            breaker_failures=breaker_failures, breaker_cooldown_s=breaker_cooldown_s,
            admissions=admissions,
        )  # fmt: skip
        self._peers = PeerJobs(self._slots, next_id)
        self._has_tiers = bool(tiers)
        # Bound once: the lookup path runs per block.
        self._get = self._slots.get
        self._state = self._slots.state
        self._scan_prefix = self._slots.scan_prefix
        self._copy_down = self._traffic.copy_down
        self._judged = bool(self._traffic.judged)
        self._cascade = self._traffic.cascade if tiers else None
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
            "store_refused": 0,
        }
        serving = any(t.serves_peers for t in tiers)
        self._lock: Any = threading.RLock() if serving else contextlib.nullcontext()

    @property
    def lock(self) -> Any:
        """The context manager every call below enters: a real (reentrant) lock when a
        tier serves peers from its own threads, else a no-op. An engine adapter that
        must hold the manager across several calls (vLLM holds its manager for a
        whole scheduler step) holds this one, so that no second lock is taken."""
        return self._lock

    def idle(self) -> bool:
        """No tier job running, no cascade queued, no promotion waiting for `step()`:
        nothing changes until the engine calls again (an engine may stop stepping)."""
        with self._lock:
            return self._traffic.idle()

    # ------------------------------------------------------------------ lookups

    def lookup(self, key: BlockKey, tiers: Container[int] | None = None,
               request_id: str | None = None) -> LookupResult:
        """Where `key` is: HIT (pool, readable now), HIT_PENDING, RETRY or MISS.
        A hit in a secondary tier reserves a slot and starts a promotion. `tiers`:
        the indices (config order) of the secondary tiers that may be asked (a
        request's own choice of where it loads from); None: every tier. The pool
        is always asked. `request_id`: the engine request asking (the id of
        `on_request_start`), for the tiers whose answers depend on it
        (`SecondaryTier.lookup_in_request`); None: no request."""
        with self._lock:
            return self._lookup(key, tiers, request_id)

    @property
    def request_lookups(self) -> bool:
        """Whether a tier answers lookups per request (`answers_in_request`): where
        not, an engine adapter need not pass request ids at all."""
        return bool(self._traffic.in_request)

    def promotion_source(self, key: BlockKey) -> str | None:
        """The name of the tier whose promotion of `key` into the pool is on its way
        (its lookups answer HIT_PENDING), else None."""
        with self._lock:
            return self._traffic.promotion_source(key)

    def _lookup(self, key: BlockKey, tiers: Container[int] | None = None,
                request_id: str | None = None) -> LookupResult:
        c = self.counters
        c["lookups"] += 1
        slot = self._get(key)
        if slot is not None:
            if self._state[slot] == READY:
                c["hits"] += 1
                if self._judged:  # a use: admission policies count it
                    self._traffic.used(key, slot)
                return LookupResult.HIT
            c["pending"] += 1
            return LookupResult.HIT_PENDING
        result = (self._traffic.lookup(key, tiers, request_id) if self._has_tiers
                  else LookupResult.MISS)
        if result is LookupResult.MISS:
            c["misses"] += 1
        elif result is LookupResult.RETRY:
            c["retries"] += 1
        else:
            c["pending"] += 1
        return result

    def lookup_prefix(self, keys: Iterable[BlockKey],
                      request_id: str | None = None) -> PrefixLookup:
        """Scan a prefix until the first MISS: how many leading blocks are readable
        now, and whether asking again next step may find more (a promotion or probe
        is in flight). Promotions for the whole prefix start in this one call.
        `request_id`: as for `lookup`."""
        with self._lock:
            if not self._has_tiers:
                return self._pool_prefix(keys)
            hits = 0
            leading = True
            retry = False
            lookup, get = self._lookup, self._get
            slots = self._slots
            # A promotion started further on must not evict a block this call reports
            # as readable: once the scan first goes down to a tier, the leading hits
            # are held until it ends. (Pool-only scans take no holds at all.)
            leading_hits: list[tuple[BlockKey, int]] = []
            holding = False
            try:
                for key in keys:
                    if not holding and self._has_tiers and get(key) is None:
                        for k, s in leading_hits:
                            slots.hold(k, s)
                        holding = True
                    r = lookup(key, None, request_id)
                    if r is LookupResult.HIT:
                        if leading:  # (a HIT is resident: get() gives its slot)
                            hits += 1
                            leading_hits.append((key, get(key)))  # type: ignore[arg-type]
                        continue
                    if r is LookupResult.MISS:
                        break
                    leading = False
                    retry = True
            finally:
                if holding:
                    for k, s in leading_hits:
                        slots.release(k, s)
            return PrefixLookup(hits, retry)

    def _pool_prefix(self, keys: Iterable[BlockKey]) -> PrefixLookup:
        """`lookup_prefix` without secondary tiers: nothing to promote or hold, so the
        pool answers for the whole prefix at once (same counters as `_lookup` per
        block: every key up to and including the first miss is one lookup)."""
        if not isinstance(keys, list | tuple):
            keys = list(keys)
        resident, leading, ready = self._scan_prefix(keys)
        c = self.counters
        missed = resident < len(keys)
        c["lookups"] += resident + missed
        c["hits"] += ready
        c["pending"] += resident - ready
        c["misses"] += missed
        return PrefixLookup(leading, ready < resident)

    # ------------------------------------------------------------------ loads

    def prepare_load(self, keys: Sequence[BlockKey]) -> list[int]:
        """Pin the blocks (all must be HIT) and return their slots, in order;
        `KeyError` (and nothing pinned) when one is not readable."""
        with self._lock:
            slots = self._slots.hold_readable(keys)
            self.counters["loaded_blocks"] += len(slots)
            return slots

    def complete_load(self, keys: Sequence[BlockKey]) -> None:
        """The engine's loads of `keys` ended: unpin them."""
        with self._lock:
            self._slots.release_keys(keys)

    def touch(self, keys: Sequence[BlockKey]) -> None:
        """The blocks were used: refresh recency in the pool (and tiers that care)."""
        with self._lock:
            self._slots.touch(keys)
            if self._has_tiers:
                self._traffic.touch(keys)

    def reorder(
        self, keys: Sequence[BlockKey], used: Container[BlockKey] = (), *, tiers: bool = True
    ) -> None:
        """The engine observed `keys` (in this order: the last one becomes the
        newest): refresh their recency in the pool without counting each as a use
        (`EvictionPolicy.reorder_many`: those of `used` are uses). Tiers that care
        are told all of them (`SecondaryTier.touch`) unless `tiers` is False (an
        engine placing the blocks it just began to store)."""
        with self._lock:
            self._slots.policy.reorder_many(keys, used)
            if tiers and self._has_tiers:
                self._traffic.touch(keys)

    @property
    def pinned_in_place(self) -> bool:
        """Whether the pool's policy keeps pinned blocks in place
        (`EvictionPolicy.keep_pinned_in_place`): a load's or store's end is then no
        use of its blocks, and only `touch` and `reorder` refresh them."""
        return self._slots.policy.pinned_in_place

    # ------------------------------------------------------------------ stores

    def prepare_store(self, keys: Sequence[BlockKey]) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not present, evicting unpinned blocks as
        needed (never a block of `keys`). None (and nothing allocated) when the pool
        cannot take them now."""
        with self._lock:
            out = self._slots.prepare_store(keys, self._copy_down)
            if out is None:
                self.counters["store_refused"] += 1
            return out

    def complete_store(self, keys: Sequence[BlockKey], success: bool = True) -> None:
        """The GPU->pool copies of `keys` ended. On success they become readable and
        (write_through) are queued for the secondary tiers; on failure they go."""
        with self._lock:
            if success:
                stored = self._slots.finish_stores(keys, self._cascade)
                self.counters["stored_blocks"] += len(stored)
                self._events.stored(stored)
            else:
                self._slots.fail_stores(keys)
                self.counters["store_failures"] += len(keys)

    # ------------------------------------------------------------------ tiers

    def step(self) -> None:
        """Collect finished tier jobs, time out late ones, submit queued promotions
        and cascades. Call once per scheduler step."""
        with self._lock:
            # Removals first: a tier reports them as they happen, results at the step,
            # so a block copied down again since its removal ends up "stored".
            self._events.collect()
            if self._has_tiers:  # no tiers: no jobs to collect, time out or submit
                self._traffic.step()

    def collect(self) -> None:
        """Collect the tiers' finished jobs now, as `step()` does first, and nothing
        else: promotions that ended land (their lookups become HITs), copies that
        ended release their blocks. For an engine whose step looks blocks up before
        it calls `step()` at the step's end: collecting at the step's first lookup
        lets a promotion that ended meanwhile serve this step, not the next. O(1)
        when no tier job runs."""
        with self._lock:
            if self._has_tiers and self._traffic.jobs:
                self._events.collect()
                self._traffic.collect()

    def drain(self, timeout: float | None = None) -> bool:
        """Submit everything queued and wait for the tiers' jobs (shutdown, tests).
        False when `timeout` passed or the tiers stopped making progress (a tier
        that never reports, a breaker holding cascades back). Never holds the lock
        while it waits: a peer-serving tier's threads may need the manager."""
        end = None if timeout is None else time.monotonic() + timeout
        traffic = self._traffic
        self.step()
        while True:
            with self._lock:
                if traffic.idle():
                    return True
                before = traffic.progress()
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            traffic.drain_tiers(left)
            self.step()
            with self._lock:
                if traffic.progress() == before:
                    return False

    # ------------------------------------------------------------------ peers

    def create_store_job(self, keys: Sequence[BlockKey]) -> TransferJob | None:
        with self._lock:
            return self._peers.create(keys)

    def complete_store_job(self, job_id: int) -> None:
        with self._lock:
            self._peers.complete(job_id)

    def watch_removals(self, listener: Callable[[Sequence[BlockKey]], None]) -> bool:
        """See `ParentManager.watch_removals`: `listener` is called from the
        eviction (under the lock), before the freed slots are handed out again."""
        with self._lock:
            self._events.listen(listener)
        return True

    # ------------------------------------------------------------------ requests

    def on_request_start(self, request_id: str, params: Mapping[str, Any] | None = None) -> None:
        """An engine request started; `params` (the engine's per-request transfer
        parameters, vLLM's `kv_transfer_params`) go to every tier."""
        self._traffic.request_started(request_id, params)

    def on_request_finished(self, request_id: str) -> None:
        self._traffic.request_finished(request_id)

    # ------------------------------------------------------------------ events

    def enable_events(self) -> None:
        """Keep stored/removed events from now on (see `take_events`)."""
        with self._lock:
            self._events.enable()

    @property
    def events_enabled(self) -> bool:
        return self._events.enabled

    def take_events(self) -> list[OffloadEvent]:
        """Stored/removed notifications since the last call, oldest first, each
        naming its tier (`cpu` or a secondary tier); always empty unless events are
        enabled."""
        with self._lock:
            self._events.collect()
            return self._events.take()

    # ------------------------------------------------------------------ misc

    def slot_of(self, key: BlockKey) -> int | None:
        """The slot of a resident block (tests, peers); None if absent."""
        return self._get(key)

    def resident_blocks(self) -> list[tuple[BlockKey, int]]:
        """The pool's readable blocks `(key, slot)` in its policy's eviction order:
        the next victim first, the hottest last (`kvtiers.ops.pool_snapshot`).
        O(resident blocks): a tool's call, not a step's."""
        with self._lock:
            return self._slots.ready_by_use()

    def stats(self, *, tiers: bool = True) -> dict[str, Any]:
        """The pool's counters and each tier's (`tiers=False`: the pool's only, cheap
        enough for every scheduler step; "tiers" is then empty)."""
        with self._lock:
            slots = self._slots
            pool = dict(self.counters)
            pool.update(
                evictions=slots.evictions,
                num_slots=self.num_slots,
                resident=len(slots),
                pinned=slots.pinned,
                free=slots.free_count,
            )
            ours = self._traffic.counters() if tiers else []
        # The tiers' own stats outside the manager's lock: a tier may take locks of
        # its own (one that serves peers calls back into the manager under them).
        by_tier = {}
        for rt, counters in ours:
            try:
                tier_stats = rt.tier.stats().as_dict()
            except Exception:  # noqa: BLE001
                tier_stats = {}
            by_tier[rt.name] = {**tier_stats, **counters}
        return {"pool": pool, "tiers": by_tier}

    def reset(self) -> None:
        """Drop every block that is not pinned, and every queued cascade."""
        with self._lock:
            self._traffic.drop_queued()
            self._slots.clear()

    def close(self) -> None:
        """Close every tier. The manager must not be used afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # Not under the lock: a tier's close may wait for its threads, which may be
        # serving a peer through this manager.
        self._traffic.close_tiers()
