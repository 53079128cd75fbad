"""A kvtiers tier's counters as vLLM connector stats (Prometheus through vLLM).

vLLM builds its Prometheus metrics in the API server from the spec's
`build_metric_definitions` (which asks each secondary tier class), and fills them
from the `OffloadingConnectorStats` payloads the scheduler sends each step (which
ask each tier's `get_stats`). Every name a payload carries must be defined, with the
same label names. `definitions()` is the one list of both; `StatsDeltas` turns
successive `TierStats` snapshots into payloads: counters as the increase since the
last payload, usage and capacity as gauges.

Every series is labelled by vLLM's tier label (`TIER_LABEL`, "<index>:<tier type>",
the value vLLM's own tiering metrics use for the same tier); failed keys also by
reason (`kvtiers.FailureReason` values).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from kvtiers import TierStats

PREFIX = "vllm:kv_offload_kvtiers_"
TIER_LABEL = "tier"  # vLLM's (vllm.v1.kv_offload.tiering.base.TIER_LABEL)
REASON_LABEL = "reason"

# TierStats counter field -> (metric suffix, documentation)
COUNTERS: dict[str, tuple[str, str]] = {
    "hits": ("hits", "Lookups the kvtiers tier answered with a hit."),
    "misses": ("misses", "Lookups the kvtiers tier answered with a miss."),
    "blocks_read": ("blocks_read", "Blocks loaded from the kvtiers tier into vLLM's CPU tier."),
    "blocks_written": (
        "blocks_written",
        "Blocks stored into the kvtiers tier from vLLM's CPU tier (a block already "
        "held counts, without a copy).",
    ),
    "bytes_read": ("read_bytes", "Bytes loaded from the kvtiers tier."),
    "bytes_written": ("written_bytes", "Bytes copied into the kvtiers tier."),
    "read_seconds": ("read_seconds", "Seconds the kvtiers tier spent on loads."),
    "write_seconds": ("write_seconds", "Seconds the kvtiers tier spent on stores."),
    "evictions": ("evictions", "Blocks the kvtiers tier evicted to make room."),
}
FAILURES = PREFIX + "failed_keys"
USAGE = PREFIX + "usage_bytes"
CAPACITY = PREFIX + "capacity_bytes"
STATS_FIELDS = frozenset(f.name for f in fields(TierStats))
assert set(COUNTERS) <= STATS_FIELDS


def definitions() -> dict[str, Any]:
    """Every metric `StatsDeltas` emits: name -> vLLM's `Offloading*Metadata`."""
    from vllm.v1.kv_offload.base import OffloadingCounterMetadata, OffloadingGaugeMetadata

    out: dict[str, Any] = {
        PREFIX + suffix: OffloadingCounterMetadata(documentation=doc, labelnames=(TIER_LABEL,))
        for suffix, doc in COUNTERS.values()
    }
    out[FAILURES] = OffloadingCounterMetadata(
        documentation="Keys of kvtiers tier jobs that failed, by reason (a miss to vLLM).",
        labelnames=(TIER_LABEL, REASON_LABEL),
    )
    out[USAGE] = OffloadingGaugeMetadata(
        documentation="Bytes the kvtiers tier holds.", labelnames=(TIER_LABEL,)
    )
    out[CAPACITY] = OffloadingGaugeMetadata(
        documentation="The kvtiers tier's capacity in bytes (0: unbounded or unknown).",
        labelnames=(TIER_LABEL,),
    )
    return out


class StatsDeltas:
    """Successive `TierStats` snapshots -> vLLM stats payloads. Scheduler thread."""

    def __init__(self, tier_label: str) -> None:
        self.labels = (tier_label,)
        self._last = TierStats()
        self._gauges: tuple[int, int] | None = None

    def payload(self, now: TierStats) -> Any:
        """An `OffloadingConnectorStats` with what changed since the last call, or None
        when nothing did."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        stats = OffloadingConnectorStats()
        last = self._last
        for name, (suffix, _) in COUNTERS.items():
            delta = getattr(now, name) - getattr(last, name)
            if delta > 0:
                stats.increase_counter(PREFIX + suffix, delta, self.labels)
        for reason, count in now.errors.items():
            delta = count - last.errors.get(reason, 0)
            if delta > 0:
                stats.increase_counter(FAILURES, delta, (*self.labels, reason))
        gauges = (now.usage_bytes, now.capacity_bytes or 0)
        if gauges != self._gauges:
            stats.set_gauge(USAGE, gauges[0], self.labels)
            stats.set_gauge(CAPACITY, gauges[1], self.labels)
            self._gauges = gauges
        self._last = replace(now, errors=dict(now.errors))
        return None if stats.is_empty() else stats
