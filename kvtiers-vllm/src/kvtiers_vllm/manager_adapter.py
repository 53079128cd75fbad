"""`KvtiersManager`: kvtiers' `TieringOffloadingManager` behind vLLM's
`OffloadingManager` interface (vLLM 0.33 and 0.34), for `KvtiersOffloadingSpec`.

What vLLM's scheduler-side connector calls, and what each call becomes:

- `lookup` / `prepare_load` / `complete_load` / `prepare_store` /
  `complete_store`: the kvtiers calls of the same names (`lookup` with the
  request's id where a tier answers per request). The first `lookup` of a step
  first collects the tiers' finished jobs (`collect`), as vLLM's tiering manager
  polls its tiers there: a promotion that ended since the last step serves this
  step's lookups, not the next one's. Keys pass through untouched
  (kvtiers keys are byte for byte vLLM's `OffloadKey`); slots are vLLM's CPU chunk
  ids and come back in the order of the keys given (vLLM hands them group by group),
  as a `CPULoadStoreSpec`.
- `on_schedule_end`: kvtiers' `step()` (collect tier jobs, submit the step's
  promotions and cascades as batched jobs).
- `on_new_request` / `on_request_finished`: the request hooks (a request's
  `kv_transfer_params` go to every tier); at `on_request_finished` the request's
  recency is committed in prefix order, head last, as vLLM's CPU cache policies do
  (`request_recency.RequestRecency`: the keys it loaded, offered or stored).
- `take_events`, `get_stats`, `config_info`, `reset_cache`, `on_reset_flushed`,
  `shutdown`: see each method.

Exclusion: `lock` is the kvtiers manager's own lock (a no-op unless a tier serves
peers from its threads), so the lock vLLM holds for the scheduler step is the only
one on the scheduler path; kvtiers' calls re-enter it (reentrant) at no cost when it
is a no-op.

Scheduler thread only (vLLM holds `lock` around every call but `shutdown`). Nothing
here blocks on I/O except `shutdown` (a bounded drain of the tiers' writes); every
call costs O(1) per block.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Sequence
from functools import partial
from typing import Any, cast

from kvtiers.manager import TieringOffloadingManager
from kvtiers.sdk import LookupResult as KvLookup
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    ConfigInfoMapping,
    LoadStoreSpec,
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TierFilter,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtiers_vllm.request_recency import RequestRecency
from kvtiers_vllm.spec_metrics import StatsDelta
from kvtiers_vllm.store_threshold import StoreThreshold

log = logging.getLogger("kvtiers_vllm")

_RESULTS = {
    KvLookup.HIT: LookupResult.HIT,
    KvLookup.MISS: LookupResult.MISS,
    KvLookup.HIT_PENDING: LookupResult.HIT_PENDING,
    KvLookup.RETRY: LookupResult.RETRY,
}

#: Where a secondary tier's blocks live, as vLLM's events name it, by tier type;
#: a type not listed (a third-party tier) is remote storage.
TIER_PLACES: dict[str, tuple[Medium, Locality]] = {
    "fs": (Medium.STORAGE, Locality.LOCAL),
    "memory": (Medium.CPU, Locality.LOCAL),
    "s3": (Medium.STORAGE, Locality.REMOTE),
    "p2p": (Medium.CPU, Locality.REMOTE),
}
_CPU = "cpu"
_MEDIUM_SOURCES = {Medium.STORAGE: CacheHitSource.DISK, Medium.CPU: CacheHitSource.HOST}


def hit_source(tier_type: str, place: tuple[Medium, Locality]) -> CacheHitSource:
    """What vLLM's prefix-hit counters call a hit promoted from a tier of this type
    (vLLM's own tiers: by medium, `P2P` for peers)."""
    return CacheHitSource.P2P if tier_type == "p2p" else _MEDIUM_SOURCES[place[0]]


class KvtiersManager(OffloadingManager):
    """See the module docstring. `manager` is owned from now on (`shutdown` closes
    it); `tier_types` maps each tier's display name ("fs", "fs#2") to its type;
    `info` is the pool's row of `config_info`; `on_shutdown` runs last (it releases
    the scheduler's view of vLLM's shared CPU region). `touch_orders_only`: the
    pool's policy takes a touch as recency alone (LRU), not as a second use (ARC,
    SIEVE): a request's stored blocks are then touched too (`RequestRecency`, where
    the pool's policy does not keep pinned blocks in place)."""

    def __init__(
        self,
        manager: TieringOffloadingManager,
        *,
        tier_types: dict[str, str],
        info: ConfigInfoMapping,
        shutdown_drain_s: float = 5.0,
        stats_interval_s: float = 1.0,
        on_shutdown: Any = None,
        store_threshold: StoreThreshold | None = None,
        touch_orders_only: bool = False,
    ):
        self._m = manager
        in_place = manager.pinned_in_place
        self._recency = RequestRecency(
            manager.touch, recency_only=touch_orders_only,
            reorder=manager.reorder if in_place else None,
            place=partial(manager.reorder, tiers=False) if in_place else None,
        )  # fmt: skip
        self._threshold = store_threshold
        self._tier_types = dict(tier_types)
        self._info = dict(info)
        self._shutdown_drain_s = shutdown_drain_s
        self._on_shutdown = on_shutdown
        self._stats = StatsDelta()
        self._stats_interval_s = stats_interval_s
        self._next_tier_stats = 0.0
        # Bound once: these run per block.
        self._lookup = manager.lookup
        self._by_request = bool(getattr(manager, "request_lookups", False))
        # Engine transfers in flight (vLLM forgets them at reset_cache: their
        # complete_* never comes), so a reset can fence their blocks.
        self._stores: dict[bytes, None] = {}
        self._loads: dict[bytes, int] = {}
        # Fenced at the last reset until on_reset_flushed: blocks a worker may still
        # write or read. Looked up, they are misses.
        self._fenced_stores: dict[bytes, None] = {}
        self._fenced_loads: dict[bytes, int] = {}
        self._fenced: set[bytes] | None = None
        self._closed = False
        # Per tier (config order): vLLM's medium and locality, for requests'
        # `kv_load_tiers`; the tier allowed by each filter seen, computed once.
        self._places = [
            TIER_PLACES.get(kind, (Medium.STORAGE, Locality.REMOTE))
            for kind in self._tier_types.values()
        ]
        self._filters: dict[TierFilter, frozenset[int]] = {}
        self._hit_sources = {
            name: hit_source(kind, place)
            for (name, kind), place in zip(self._tier_types.items(), self._places, strict=True)
        }
        # Per request: the blocks it promoted, and the tier each came from.
        self._sources: dict[str, dict[bytes, CacheHitSource]] = {}
        # With tiers: collect their finished jobs at the first lookup of a step.
        self._has_tiers = bool(self._tier_types)
        self._collect_due = self._has_tiers

    @property
    def kvtiers_manager(self) -> TieringOffloadingManager:
        """The kvtiers manager (stats, tests). Use it under `lock` only."""
        return self._m

    @property
    def lock(self) -> Any:
        return self._m.lock

    # ---------------------------------------------------------------- lookups

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """The pool, then the secondary tiers the request may load from: all of
        them, or those its `kv_load_tiers` (vLLM's `load_tier_filter`) allows by
        medium and locality (`TIER_PLACES`), as vLLM's tiering manager filters.
        A tier that answers per request (`SecondaryTier.lookup_in_request`) is
        asked with the request's id."""
        if self._collect_due:  # the step's first lookup: what ended lands now
            self._collect_due = False
            self._m.collect()
        fenced = self._fenced
        if fenced is not None and key in fenced:
            return LookupResult.MISS
        load_filter = req_context.load_tier_filter
        # The request's id only where a tier answers per request (p2p: a request's
        # remote_prefiller): every other stack's lookups stay as they were.
        req_id = req_context.req_id if self._by_request else None
        if load_filter is TierFilter.ALL:
            result = self._lookup(key) if req_id is None else self._lookup(key, None, req_id)
        else:
            result = self._lookup(key, self._allowed_tiers(load_filter), req_id)
        if result is KvLookup.HIT_PENDING:
            self._note_source(key, req_context.req_id)
        return _RESULTS[result]

    def _allowed_tiers(self, load_filter: TierFilter) -> frozenset[int]:
        allowed = self._filters.get(load_filter)
        if allowed is None:
            allowed = frozenset(
                i for i, (medium, locality) in enumerate(self._places)
                if load_filter.allows(medium, locality)
            )  # fmt: skip
            self._filters[load_filter] = allowed
        return allowed

    def _note_source(self, key: OffloadKey, req_id: str) -> None:
        """A block on its way into the pool for this request: from which tier (a
        store from the GPU in flight has none)."""
        sources = self._sources.get(req_id)
        if sources is not None and key in sources:
            return
        tier = self._m.promotion_source(key)
        if tier is not None:
            if sources is None:
                sources = self._sources[req_id] = {}
            sources[key] = self._hit_sources.get(tier, CacheHitSource.EXTERNAL_UNSPECIFIED)

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        """The tier a hit came from for this request: the secondary tier whose
        promotion this request's lookup started (`DISK` for fs and s3, `P2P`,
        `HOST` for a tier in RAM), else the CPU pool (`HOST`), as vLLM's tiering
        manager reports."""
        sources = self._sources.get(req_context.req_id)
        if sources is not None:
            source = sources.get(key)
            if source is not None:
                return source
        return CacheHitSource.HOST

    # ---------------------------------------------------------------- loads

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        keys = keys if isinstance(keys, list) else list(keys)
        slots = self._m.prepare_load(keys)
        loads = self._loads
        for key in keys:
            loads[key] = loads.get(key, 0) + 1
        self._recency.loaded(keys, req_context)
        return CPULoadStoreSpec(slots)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        keys = keys if isinstance(keys, list) else list(keys)
        self._m.complete_load(keys)
        loads = self._loads
        for key in keys:
            n = loads.get(key, 0) - 1
            if n > 0:
                loads[key] = n
            else:
                loads.pop(key, None)

    # ---------------------------------------------------------------- stores

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        keys = keys if isinstance(keys, list) else list(keys)
        offered = keys
        if self._threshold is not None:
            keys = self._threshold.offer(keys, self._m.slot_of)
        out = self._m.prepare_store(keys)
        self._recency.offered(
            out.keys if out is not None else (),
            self._readable(offered, out.keys if out is not None else ()),
            req_context,
        )
        if out is None:
            return None
        if out.keys:
            self._stores.update(dict.fromkeys(out.keys))
            sources = self._sources.get(req_context.req_id)
            if sources:  # its promotion failed: the GPU's copy is the one loaded
                for key in out.keys:
                    sources.pop(key, None)
        # vLLM's evicted_keys is informational (its events come from take_events).
        return PrepareStoreOutput(
            keys_to_store=cast("list[OffloadKey]", out.keys),
            store_spec=CPULoadStoreSpec(out.slots),
            evicted_keys=cast("list[OffloadKey]", out.evicted),
        )

    def _readable(
        self, offered: list[OffloadKey], stored: Sequence[OffloadKey]
    ) -> list[OffloadKey]:
        """The keys of a `prepare_store` offer that were readable in the pool: resident,
        not given a slot by this call, no store (`_stores`) or promotion in flight."""
        if len(stored) == len(offered):
            return []  # every key offered was new (the common case)
        new = set(stored)
        slot_of, storing, promoting = self._m.slot_of, self._stores, self._m.promotion_source
        return [
            k for k in offered
            if k not in new and k not in storing and slot_of(k) is not None
            and promoting(k) is None
        ]  # fmt: skip

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        if isinstance(keys, list):
            ordered = keys
        else:
            # vLLM hands a set (0.33) or a tuple (0.34): in prefix order, so that
            # when a tier's cascade queue is full the blocks it drops are a
            # prefix's tail, not holes in it.
            position = req_context.get_offload_key_position
            ordered = sorted(keys, key=lambda k: position(k) or 0)
        self._m.complete_store(ordered, success)
        pop = self._stores.pop
        for key in ordered:
            pop(key, None)
        if success:
            self._recency.stored(ordered, req_context)

    # ---------------------------------------------------------------- requests

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._m.on_request_start(req_context.req_id, req_context.kv_transfer_params)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._sources.pop(req_context.req_id, None)
        self._recency.finished(req_context)
        self._m.on_request_finished(req_context.req_id)

    # ---------------------------------------------------------------- steps

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        # Most steps of a busy engine have no tier work: nothing to collect or submit.
        if not self._m.idle():
            self._m.step()
        self._collect_due = self._has_tiers

    def has_pending_work(self) -> bool:
        return not self._m.idle()

    # ---------------------------------------------------------------- events

    def take_events(self) -> Iterable[OffloadingEvent]:
        """kvtiers' stored/removed events as vLLM's: the pool's are CPU events of
        the primary (no ownership); a secondary tier's carry its name as ownership,
        its medium and locality (`TIER_PLACES`), and `removal_expected`: kvtiers'
        tiers report what leaves them, so routers learn of it."""
        events = []
        for ev in self._m.take_events():
            removed = ev.kind == "removed"
            keys = cast("list[OffloadKey]", ev.keys)  # kvtiers keys are OffloadKeys
            if ev.tier == _CPU:
                events.append(OffloadingEvent(keys=keys, medium=Medium.CPU, removed=removed))
                continue
            medium, locality = TIER_PLACES.get(
                self._tier_types.get(ev.tier, ""), (Medium.STORAGE, Locality.REMOTE)
            )
            events.append(OffloadingEvent(
                keys=keys, medium=medium, removed=removed, locality=locality,
                ownership=ev.tier, removal_expected=True,
            ))  # fmt: skip
        return events

    # ---------------------------------------------------------------- metrics

    def get_stats(self) -> OffloadingConnectorStats | None:
        """What changed since the last call, under the names
        `KvtiersOffloadingSpec.build_metric_definitions` declares. vLLM asks every
        step: the pool's counters come every time, the tiers' (their own stats take
        locks and copy) at most every `stats_interval_s` (0: every time)."""
        now = time.monotonic()
        with_tiers = now >= self._next_tier_stats
        if with_tiers:
            self._next_tier_stats = now + self._stats_interval_s
        stats = self._m.stats(tiers=with_tiers)
        if self._threshold is not None:
            stats["pool"]["stores_skipped"] = self._threshold.skipped
        payload = self._stats.take(stats)
        return None if payload.is_empty() else payload

    def config_info(self) -> Sequence[ConfigInfoMapping]:
        """One row for the CPU pool, one for each secondary tier (`tier`, `tier_type`)."""
        rows: list[ConfigInfoMapping] = [{**self._info, "tier": _CPU, "tier_type": _CPU}]
        rows += [{"tier": name, "tier_type": kind} for name, kind in self._tier_types.items()]
        return rows

    # ---------------------------------------------------------------- reset

    def reset_cache(self) -> None:
        """Drop every block of the pool. vLLM forgets the transfers in flight (their
        completions never come): their blocks stay held and are misses until
        `on_reset_flushed`, when the workers no longer touch them. Secondary tiers
        keep their blocks (as vLLM's own tiering does)."""
        if self._stores or self._loads:
            for key in self._stores:
                self._fenced_stores[key] = None
            for key, n in self._loads.items():
                self._fenced_loads[key] = self._fenced_loads.get(key, 0) + n
            self._stores, self._loads = {}, {}
            self._fenced = set(self._fenced_stores) | set(self._fenced_loads)
        self._sources.clear()
        self._recency.reset()
        self._m.reset()

    def on_reset_flushed(self) -> None:
        """The workers reported every job of the reset: failed stores go, the
        loads' holds go, and the blocks read before the reset are dropped."""
        if self._fenced is None:
            return
        stores, loads = list(self._fenced_stores), self._fenced_loads
        self._fenced_stores, self._fenced_loads, self._fenced = {}, {}, None
        if stores:
            self._m.complete_store(stores, success=False)
        if loads:
            for key, n in loads.items():
                for _ in range(n):
                    self._m.complete_load([key])
            # Their blocks were read from before the reset: drop them (and the
            # pool's other unheld blocks, few since the reset).
            self._m.reset()

    # ---------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        """Let the tiers finish their writes (at most `shutdown_drain_s`), close
        them, then release the scheduler's view of the shared region. Called
        without `lock` (vLLM's contract); the drain never holds it while it waits."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._m.drain(self._shutdown_drain_s):
                log.warning(
                    "kvtiers: the tiers did not finish their writes within %.1f s at "
                    "shutdown; closing them anyway", self._shutdown_drain_s,
                )  # fmt: skip
        finally:
            try:
                self._m.close()
            finally:
                if self._on_shutdown is not None:
                    self._on_shutdown()
