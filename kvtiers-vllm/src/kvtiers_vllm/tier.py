"""`KvtiersTier`: any kvtiers tier as one of vLLM's secondary tiers (level 1).

vLLM's `TieringOffloadingSpec` keeps its own CPU tier and GPU worker; below the CPU
tier it runs its `secondary_tiers`. An entry `{"type": "kvtiers", "tier": {...}}`
(after the `vllm.general_plugins` entry point registered the name) or
`{"type": "KvtiersTier", "module_path": "kvtiers_vllm.tier", "tier": {...}}` builds
the kvtiers tier its "tier" section names (fs, s3, p2p, a third-party plugin: by its
registered name, through kvtiers' plugin registry) over vLLM's CPU tier, and
translates between the two contracts (options: `kvtiers_vllm.tier_config`):

- keys pass through untouched: vLLM's `OffloadKey` and kvtiers' `BlockKey` are the
  same bytes (block hash + 4-byte big-endian group index); chunk ids are pool slots;
- the namespace is vLLM's run identity (`kvtiers_vllm.identity`);
- per-key job results become vLLM's (`success`, `successful_keys` of a partly
  failed load, bytes and seconds);
- events: stored keys when a store commits, and removals (evictions, corrupt
  blocks, deletions the tier reports through `TierContext.events`), which vLLM's own
  fs and object tiers never send, so a KV-aware router also learns a block left;
- stats: the tier's counters as vLLM connector stats (`kvtiers_vllm.tier_metrics`);
- promotions carry a deadline (`job_timeout_s`, on the tier's clock) that the kvtiers
  tier honours where it can (work not started by then fails with `timeout`). On a
  vLLM with deferred release (0.34) one still running at its deadline is reported
  failed at once, so that its request recomputes instead of waiting, with an event
  set when the kvtiers tier reports the job (its I/O can no longer touch the chunks)
  or when `drain_jobs` has waited for it; until then vLLM keeps the chunks out of its
  free pool. On 0.33 a promotion is reported when the tier reports it.

Threads: vLLM calls every method under its manager lock, from the scheduler thread
(this class does not set `tolerates_off_thread_polling`), which is what kvtiers'
contract calls the scheduler thread; every byte moves on the kvtiers tier's threads.
`drain_jobs` and `shutdown` block.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any, ClassVar

from kvtiers_vllm.compat import require_vllm

require_vllm()

from kvtiers import LookupResult as KvLookup  # noqa: E402
from kvtiers import TierContext  # noqa: E402
from kvtiers import TransferJob as KvJob  # noqa: E402
from kvtiers.sdk import TierEvents  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import (  # noqa: E402
    JobResult,
    SecondaryTierManager,
    TransferJob,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource  # noqa: E402

from kvtiers_vllm import identity, tier_metrics  # noqa: E402
from kvtiers_vllm.compat import results  # noqa: E402
from kvtiers_vllm.late_promotions import LatePromotions  # noqa: E402
from kvtiers_vllm.tier_config import (  # noqa: E402
    JOB_TIMEOUT_S,
    STATS_INTERVAL_S,
    TierOptions,
    read_options,
    under,
)

log = logging.getLogger(__name__)

_LOOKUP = {
    KvLookup.HIT: LookupResult.HIT,
    KvLookup.MISS: LookupResult.MISS,
    KvLookup.RETRY: LookupResult.RETRY,
    KvLookup.HIT_PENDING: LookupResult.RETRY,  # a tier never answers it; retry if one does
}
_HIT_SOURCE = {Medium.STORAGE: CacheHitSource.DISK, Medium.CPU: CacheHitSource.HOST}
INFO_TIER = "kvtiers_tier"  # config-info label: the kvtiers tier type
INFO_NAMESPACE = "kvtiers_namespace"  # config-info label: the namespace fingerprint


class KvtiersTier(SecondaryTierManager):
    """A kvtiers tier under vLLM's CPU tier. Built by vLLM's `SecondaryTierFactory`
    with vLLM's arguments and the entry's options (`kvtiers_vllm.tier_config`);
    keywords a later vLLM may add are ignored with a warning naming them."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        *,
        tier: object = None,
        medium: object = "STORAGE",
        locality: object = None,
        enable_kv_events: object = True,
        job_timeout_s: object = JOB_TIMEOUT_S,
        stats_interval_s: object = STATS_INTERVAL_S,
        **unknown: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        options = read_options(
            offloading_spec, tier, medium, locality, enable_kv_events, job_timeout_s,
            stats_interval_s,
        )
        if unknown:
            log.warning(
                "kvtiers tier %s: ignoring options it does not know: %s",
                options.path,
                ", ".join(sorted(unknown)),
            )
        self.options: TierOptions = options
        self.medium = Medium(options.medium)  # type: ignore[misc]  # per instance
        self.cache_hit_source = _HIT_SOURCE[self.medium]
        self.locality = None if options.locality is None else Locality(options.locality)
        index = options.index
        self.tier_label = f"{'?' if index is None else index + 1}:{tier_type}"
        self.ownership = f"{tier_type}:{options.section.type}"

        block_bytes = identity.payload_bytes(offloading_spec, self.block_size_bytes)
        self.pool = identity.pool_view(primary_kv_view, block_bytes)
        self.namespace = identity.namespace_for(offloading_spec, block_bytes)
        self._events_on = bool(
            options.enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events
        )
        self.tier_events = TierEvents()
        if self._events_on:
            self.tier_events.enable()
        ctx = TierContext(
            pool=self.pool,
            namespace=self.namespace,
            logger=logging.getLogger(f"kvtiers.contract.tier.{options.section.type}"),
            events=self.tier_events,
        )
        with under(options.section.path):
            self.tier = ctx.build_tier(options.section, suffix=options.section.type)
        if self.tier.serves_peers:
            log.warning(
                "kvtiers tier %s (%s): serving peers needs kvtiers' manager "
                "(spec KvtiersOffloadingSpec); under vLLM's spec it only reads and writes",
                options.path,
                options.section.type,
            )
        self._by_request = self.tier.answers_in_request()
        self._stored: list[OffloadKey] = []  # committed since the last take_events
        self._in_flight: dict[int, bool] = {}  # job id -> is a load
        # Promotions reported failed at their deadline (vLLM with deferred release).
        self._clock = ctx.clock
        self._late = LatePromotions(ctx.clock) if results.DEFERRED_RELEASE else None
        self._deltas = tier_metrics.StatsDeltas(self.tier_label)
        self._next_stats = 0.0  # on the tier's clock
        self._closed = False
        log.info(
            "kvtiers tier %s: %s over vLLM's CPU tier (%d chunks of %d bytes), namespace %s",
            options.path,
            options.section.type,
            self.pool.num_slots,
            block_bytes,
            self.namespace,
        )

    # -- lookups and jobs (scheduler thread, never blocking) --

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._late is not None and self._late.is_late(key):
            return LookupResult.MISS  # a late promotion still reads it: recompute
        if self._by_request:  # the tier answers per request (p2p's remote_prefiller)
            return _LOOKUP[self.tier.lookup_in_request(key, req_context.req_id)]
        return _LOOKUP[self.tier.lookup(key)]

    def _job(self, job: TransferJob, deadline: float | None = None) -> KvJob:
        return KvJob(job.job_id, list(job.keys), [int(c) for c in job.chunk_ids], deadline)

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._in_flight[job_metadata.job_id] = False
        self.tier.submit_store(self._job(job_metadata))

    def submit_load(self, job_metadata: TransferJob) -> None:
        job_id = job_metadata.job_id
        self._in_flight[job_id] = True
        deadline = self._clock() + self.options.job_timeout_s
        job = self._job(job_metadata, deadline)
        if self._late is not None:
            self._late.track(job_id, deadline, job.keys)
        self.tier.submit_load(job)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        late = self._late
        for result in self.tier.get_finished_jobs():
            if late is not None and late.finished(result.job_id):
                continue  # reported failed at its deadline; its event is set now
            is_load = self._in_flight.pop(result.job_id, False)
            partial = is_load and bool(result.failed) and bool(result.ok)
            out.append(
                results.job_result(
                    result.job_id,
                    result.success,
                    successful_keys=tuple(result.ok) if partial else None,
                    transfer_time=result.seconds,
                    transfer_bytes=result.bytes_moved,
                )
            )
            if self._events_on and not is_load and result.ok:
                self._stored.extend(OffloadKey(k) for k in result.ok)
        if late is not None and late.tracking:
            out.extend(self._expire(late))
        return out

    def _expire(self, late: LatePromotions) -> list[JobResult]:
        """Promotions past their deadline, reported failed with their release
        deferred (the tier may still be writing their chunks)."""
        out = []
        for job_id, release in late.expire():
            del self._in_flight[job_id]
            out.append(results.failed_while_writing(job_id, release))
        if out:
            log.warning(
                "kvtiers tier %s: %d promotion(s) past job_timeout_s (%.3g s) reported "
                "failed; vLLM holds their CPU chunks until the tier's reads end",
                self.options.path,
                len(out),
                self.options.job_timeout_s,
            )
        return out

    @property
    def releases_pending(self) -> int:
        """Promotions reported failed whose chunks the tier's I/O may still touch."""
        return 0 if self._late is None else self._late.releases_pending

    @property
    def jobs_in_flight(self) -> int:
        """Jobs submitted to the kvtiers tier and not yet reported back."""
        return len(self._in_flight)

    def has_pending_work(self) -> bool:
        return bool(self._in_flight) or (self._late is not None and self._late.late > 0)

    # -- requests --

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self.tier.on_request_start(req_context.req_id, req_context.kv_transfer_params)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.tier.on_request_finished(req_context.req_id)

    # -- events, stats, info --

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Stored keys, then removals, since the last call. In that order: a key
        stored and evicted between two calls ends up removed, as it is; the rare key
        removed and stored again reads as removed (a miss for a router, never a
        block it would wrongly count on)."""
        if not self._events_on:
            return []
        out = []
        if self._stored:
            out.append(
                OffloadingEvent(
                    keys=self._stored,
                    medium=self.medium,
                    removed=False,
                    locality=self.locality,
                    ownership=self.ownership,
                    removal_expected=True,
                )
            )
            self._stored = []
        removed = self.tier_events.take()
        if removed:
            out.append(
                OffloadingEvent(
                    keys=[OffloadKey(k) for k in removed],
                    medium=self.medium,
                    removed=True,
                    locality=self.locality,
                    ownership=self.ownership,
                )
            )
        return out

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        """The metrics `get_stats` emits (vLLM asks in the API server, from the raw
        entry: nothing is built here)."""
        return tier_metrics.definitions()

    def get_stats(self) -> Any:
        """What changed in the tier's counters, at most every `stats_interval_s` (vLLM
        asks every scheduler step; between, None: nothing is lost, the next payload
        carries it)."""
        interval = self.options.stats_interval_s
        if interval:
            now = self._clock()
            if now < self._next_stats:
                return None
            self._next_stats = now + interval
        return self._deltas.payload(self.tier.stats())

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return (INFO_TIER, INFO_NAMESPACE)

    def config_info(self) -> dict[str, str]:
        return {INFO_TIER: self.options.section.type, INFO_NAMESPACE: self.namespace.fingerprint}

    # -- the end (blocking) --

    def drain_jobs(self) -> None:
        """Wait for every job of the tier; then no I/O touches a chunk, and every
        deferred release is set (vLLM's contract), each job's late result dropped
        when it comes."""
        self.tier.drain(None)
        self._release_all()

    def _release_all(self) -> None:
        if self._late is not None:
            self._late.release_all()

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.tier.close()
            self._release_all()
            # Our view of vLLM's CPU region: released, so that vLLM can unmap it.
            with contextlib.suppress(BufferError):
                self.pool.buffer.release()
