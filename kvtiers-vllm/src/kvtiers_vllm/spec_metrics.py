"""The Prometheus metrics `KvtiersOffloadingSpec` declares, and how the manager's
`stats()` becomes vLLM's stats payload.

vLLM builds the metric objects in the API-server process from the spec class and the
raw `kv_connector_extra_config` alone (`build_metric_definitions`): the definitions
here depend on nothing else, import no tier and look nothing up in vLLM's tier
factory. Secondary tiers are a label (`tier`: "fs", "fs#2", ...), not a name.

Counters are sent as what changed since the last payload, gauges when they changed
(Prometheus keeps a gauge's last value); a step that changed nothing sends nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
)

PREFIX = "vllm:kv_offload_kvtiers_"
TIER = "tier"
REASON = "reason"

#: Pool counters: the manager's counter name -> documentation.
POOL_COUNTERS: dict[str, str] = {
    "lookups": "Blocks looked up in the kvtiers manager.",
    "hits": "Lookups readable from the CPU pool at once.",
    "misses": "Lookups found in no tier.",
    "pending": "Lookups of blocks on their way into the CPU pool (HIT_PENDING).",
    "retries": "Lookups a tier could not answer yet (RETRY: a probe in flight).",
    "stored_blocks": "Blocks stored from the GPU into the CPU pool.",
    "store_failures": "Blocks whose store from the GPU failed.",
    "loaded_blocks": "Blocks prepared for loading from the CPU pool to the GPU.",
    "store_refused": "prepare_store calls the CPU pool could not take (every block pinned).",
    "evictions": "Blocks evicted from the CPU pool.",
    "stores_skipped": "Store candidates held back: offered fewer than store_threshold times.",
}
#: Pool gauges: name -> (documentation, how to compute it from the pool's stats).
POOL_GAUGES: dict[str, str] = {
    "pool_usage_perc": "Fraction of the CPU pool's slots holding a block.",
    "pool_pinned_perc": "Fraction of the CPU pool's slots pinned by transfers in flight.",
}
#: Per-tier counters (label `tier`): the name in `stats()["tiers"][name]` -> doc.
TIER_COUNTERS: dict[str, str] = {
    "promoted_hits": "Blocks promoted from a secondary tier into the CPU pool.",
    "promotion_failures": "Promotions from a secondary tier that failed.",
    "cascaded_blocks": "Blocks copied from the CPU pool down to a secondary tier.",
    "cascades_dropped": "Copies down never made (tier down, or evicted while deferred).",
    "cascades_deferred": "Copies down that waited, unpinned, for room in the tier's queue.",
    "cascade_failures": "Copies down that failed.",
    "timeouts": "Tier jobs past their deadline.",
    "lookup_errors": "Tier lookups that raised (counted as misses).",
    "bytes_read": "Bytes a secondary tier read into the CPU pool.",
    "bytes_written": "Bytes a secondary tier wrote from the CPU pool.",
    "evictions": "Blocks a secondary tier evicted.",
}
TIER_GAUGES: dict[str, str] = {
    "usage_bytes": "Bytes a secondary tier holds.",
    "queued_cascades": "Copies down waiting for a secondary tier.",
    "breaker_open": "1 while a tier's circuit breaker keeps it out, else 0.",
}
JOB_ERRORS = "job_errors"


def metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """Every metric the spec's manager reports."""
    defs: dict[str, OffloadingMetricMetadata] = {}
    for name, doc in POOL_COUNTERS.items():
        defs[PREFIX + name] = OffloadingCounterMetadata(documentation=doc)
    for name, doc in POOL_GAUGES.items():
        defs[PREFIX + name] = OffloadingGaugeMetadata(documentation=doc)
    for name, doc in TIER_COUNTERS.items():
        defs[PREFIX + "tier_" + name] = OffloadingCounterMetadata(
            documentation=doc, labelnames=(TIER,)
        )
    for name, doc in TIER_GAUGES.items():
        defs[PREFIX + "tier_" + name] = OffloadingGaugeMetadata(
            documentation=doc, labelnames=(TIER,)
        )
    defs[PREFIX + "tier_" + JOB_ERRORS] = OffloadingCounterMetadata(
        documentation="Failed blocks of a secondary tier's jobs, by reason.",
        labelnames=(TIER, REASON),
    )
    return defs


class StatsDelta:
    """Turns successive `TieringOffloadingManager.stats()` snapshots into vLLM's
    payloads: counter increments since the previous call, gauges that changed."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, tuple[str, ...]], float] = {}
        self._gauges: dict[tuple[str, tuple[str, ...]], float] = {}

    def take(self, stats: Mapping[str, Any]) -> OffloadingConnectorStats:
        out = OffloadingConnectorStats()
        pool = stats["pool"]
        last = self._last
        for name in POOL_COUNTERS:
            value = pool.get(name, 0)
            if last.get((PREFIX + name, ())) != value:  # most steps change few
                self._count(out, PREFIX + name, (), value)
        slots = pool.get("num_slots", 0) or 1
        self._gauge(out, PREFIX + "pool_usage_perc", (), pool.get("resident", 0) / slots)
        self._gauge(out, PREFIX + "pool_pinned_perc", (), pool.get("pinned", 0) / slots)
        for tier, values in stats["tiers"].items():
            labels = (tier,)
            for name in TIER_COUNTERS:
                self._count(out, PREFIX + "tier_" + name, labels, values.get(name, 0))
            self._gauge(out, PREFIX + "tier_usage_bytes", labels, values.get("usage_bytes", 0))
            self._gauge(
                out, PREFIX + "tier_queued_cascades", labels, values.get("queued_cascades", 0)
            )
            self._gauge(
                out, PREFIX + "tier_breaker_open", labels,
                0 if values.get("breaker", "closed") == "closed" else 1,
            )  # fmt: skip
            for reason, n in (values.get(JOB_ERRORS) or {}).items():
                self._count(out, PREFIX + "tier_" + JOB_ERRORS, (tier, str(reason)), n)
        return out

    def _gauge(
        self, out: OffloadingConnectorStats, name: str, labels: tuple[str, ...], value: float
    ) -> None:
        """A gauge is sent when it changed (Prometheus keeps the last value)."""
        key = (name, labels)
        if self._gauges.get(key) != value:
            self._gauges[key] = value
            out.set_gauge(name, value, labels)

    def _count(
        self, out: OffloadingConnectorStats, name: str, labels: tuple[str, ...], value: Any
    ) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        key = (name, labels)
        delta = value - self._last.get(key, 0)
        self._last[key] = value
        if delta > 0:
            out.increase_counter(name, delta, labels)
