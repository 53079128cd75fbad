"""Every metric kvtiers exports, defined once: name, type, labels, help, and where
its value comes from. docs/metrics.md is generated from these definitions
(`render_markdown`; a test keeps the page equal to it).

Two sources:

- **events**: what is reported through a `MetricsSink` (`count(event, value,
  **labels)`, `observe(event, value, **labels)`; a gauge's events are signed
  deltas), by the manager's and the tiers'
  instrumentation (`kvtiers.metrics.instrument`) or by a tier itself through
  `TierContext.metrics`. `MetricDef.event` names the sink name that feeds it.
- **stats**: read from the snapshot of `TieringOffloadingManager.stats()` that the
  scheduler thread publishes (`MetricDef.stat` names the field), so the scrape never
  calls into the manager or a tier.

Names follow the Prometheus conventions: `kvtiers_` prefix, base units (`_bytes`,
`_seconds`), counters end in `_total`, no label repeats what the name says.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]

#: the scheduler's calls: 1 µs .. 1 s
CALL_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0)
#: what timing a scheduler call costs, as measured by bench/metrics_overhead.py
CALL_TIMING_COST = ("0.8-0.9 µs per call on one idle core of the reference machine, "
                    "about twice that under load (`bench/metrics_overhead.py`)")
#: tier jobs and probes: 100 µs .. 60 s
JOB_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
               0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class MetricDef:
    """One exported metric. `name` is the full Prometheus name (a counter's with
    `_total`); exactly one of `event` and `stat` says where its value comes from."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    #: the MetricsSink name that feeds it
    event: str | None = None
    #: the field of the published stats snapshot that holds it
    stat: str | None = None
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if (self.event is None) == (self.stat is None):
            raise ValueError(f"{self.name}: exactly one of event and stat")
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counters, and only counters, end in _total")
        if (self.kind == "histogram") != bool(self.buckets):
            raise ValueError(f"{self.name}: histograms, and only histograms, have buckets")


_T = ("tier",)

TIER_METRICS: tuple[MetricDef, ...] = (
    MetricDef("kvtiers_tier_lookups_total", "counter",
              "Lookups the manager asked the tier, by answer (hit, miss, retry, error).",
              ("tier", "result"), event="tier_lookup"),
    MetricDef("kvtiers_tier_hits_total", "counter",
              "Lookups the tier answered with a hit, as the tier counts them.", _T,
              stat="hits"),
    MetricDef("kvtiers_tier_misses_total", "counter",
              "Lookups the tier answered with a miss, as the tier counts them.", _T,
              stat="misses"),
    MetricDef("kvtiers_tier_promoted_blocks_total", "counter",
              "Blocks promoted from the tier into the CPU pool (hits credited to it).", _T,
              stat="promoted_hits"),
    MetricDef("kvtiers_tier_read_blocks_total", "counter",
              "Blocks the tier read into the pool.", _T, stat="blocks_read"),
    MetricDef("kvtiers_tier_written_blocks_total", "counter",
              "Blocks the tier wrote from the pool.", _T, stat="blocks_written"),
    MetricDef("kvtiers_tier_read_bytes_total", "counter",
              "Bytes the tier read into the pool.", _T, stat="bytes_read"),
    MetricDef("kvtiers_tier_written_bytes_total", "counter",
              "Bytes the tier wrote from the pool.", _T, stat="bytes_written"),
    MetricDef("kvtiers_tier_job_seconds", "histogram",
              "Duration of the tier's jobs, by kind (store, load), as the tier reports "
              "them (JobResult.seconds).", ("tier", "kind"), event="tier_job_seconds",
              buckets=JOB_BUCKETS),
    MetricDef("kvtiers_tier_probe_seconds", "histogram",
              "Time from a lookup answered RETRY (a probe started) to the answer.", _T,
              event="tier_probe_seconds", buckets=JOB_BUCKETS),
    MetricDef("kvtiers_tier_failed_blocks_total", "counter",
              "Blocks of the tier's jobs that failed, by reason (missing, corrupt, io, "
              "timeout, full, closed, ...), as the manager saw them.", ("tier", "reason"),
              stat="job_errors"),
    MetricDef("kvtiers_tier_errors_total", "counter",
              "Errors the tier counted itself, by reason.", ("tier", "reason"),
              stat="errors"),
    MetricDef("kvtiers_tier_evictions_total", "counter",
              "Blocks the tier evicted to stay within its capacity.", _T, stat="evictions"),
    MetricDef("kvtiers_tier_admission_refusals_total", "counter",
              "Blocks the tier's admission policy refused to copy down.", _T,
              event="tier_admission_refused"),
    MetricDef("kvtiers_tier_dropped_cascades_total", "counter",
              "Copies down to the tier never made: it was down, its block was evicted "
              "while the copy waited for room, or (write_back) its queue was full.", _T,
              stat="cascades_dropped"),
    MetricDef("kvtiers_tier_cascaded_blocks_total", "counter",
              "Blocks copied down to the tier successfully.", _T, stat="cascaded_blocks"),
    MetricDef("kvtiers_tier_timeouts_total", "counter",
              "Jobs of the tier that passed their deadline.", _T, stat="timeouts"),
    MetricDef("kvtiers_tier_breaker_state", "gauge",
              "The tier's circuit breaker: 1 for the state it is in (closed, open, "
              "half_open), 0 for the others.", ("tier", "state"), stat="breaker"),
    MetricDef("kvtiers_tier_queued_cascades", "gauge",
              "Copies down waiting in the tier's queue.", _T, stat="queued_cascades"),
    MetricDef("kvtiers_tier_promotions_in_flight", "gauge",
              "Blocks being promoted from the tier (load jobs submitted, not collected).",
              _T, event="tier_promotions_in_flight"),
    MetricDef("kvtiers_tier_usage_bytes", "gauge",
              "Bytes the tier uses (committed and reserved).", _T, stat="usage_bytes"),
    MetricDef("kvtiers_tier_capacity_bytes", "gauge",
              "The tier's capacity bound in bytes (absent when unbounded).", _T,
              stat="capacity_bytes"),
)

MANAGER_METRICS: tuple[MetricDef, ...] = (
    MetricDef("kvtiers_pool_slots", "gauge", "Slots of the CPU pool.", stat="num_slots"),
    MetricDef("kvtiers_pool_resident_blocks", "gauge",
              "Blocks in the CPU pool (readable or being written).", stat="resident"),
    MetricDef("kvtiers_pool_pinned_blocks", "gauge",
              "Blocks of the pool pinned (being loaded or copied): never evicted.",
              stat="pinned"),
    MetricDef("kvtiers_pool_free_slots", "gauge", "Slots of the pool holding nothing.",
              stat="free"),
    MetricDef("kvtiers_pool_lookups_total", "counter",
              "The engine's lookups, by answer (hit, miss, pending, retry).", ("result",),
              stat="lookups"),
    MetricDef("kvtiers_pool_evictions_total", "counter", "Blocks evicted from the pool.",
              stat="evictions"),
    MetricDef("kvtiers_pool_stored_blocks_total", "counter",
              "Blocks stored into the pool from the GPU.", stat="stored_blocks"),
    MetricDef("kvtiers_pool_loaded_blocks_total", "counter",
              "Blocks loaded from the pool into the GPU.", stat="loaded_blocks"),
    MetricDef("kvtiers_pool_store_refusals_total", "counter",
              "prepare_store calls refused (the pool could not take the blocks).",
              stat="store_refused"),
    MetricDef("kvtiers_pool_store_failures_total", "counter",
              "Blocks whose GPU->pool copy failed.", stat="store_failures"),
    MetricDef("kvtiers_manager_promotions_in_flight", "gauge",
              "Blocks being promoted into the pool from any tier.",
              event="tier_promotions_in_flight"),
    MetricDef("kvtiers_manager_call_seconds", "histogram",
              "Duration of the scheduler's calls into the manager, by call (lookup, "
              "lookup_prefix, prepare_store, complete_store, prepare_load, "
              "complete_load, touch, step, take_events).", ("call",),
              event="manager_call_seconds", buckets=CALL_BUCKETS),
    MetricDef("kvtiers_metrics_unknown_events_total", "counter",
              "Sink reports under a name no metric is defined for (dropped).", ("event",),
              event="-"),
)

ALL_METRICS: tuple[MetricDef, ...] = TIER_METRICS + MANAGER_METRICS
#: the metric each sink name feeds (the first defined: a manager-wide metric may sum
#: a per-tier event over its tiers)
BY_EVENT: dict[str, MetricDef] = {}
for _m in ALL_METRICS:
    if _m.event is not None:
        BY_EVENT.setdefault(_m.event, _m)

#: pool lookup answers: `stats()["pool"]` counter -> `result` label
POOL_LOOKUP_RESULTS = {"hits": "hit", "misses": "miss", "pending": "pending",
                       "retries": "retry"}


def _table(defs: Iterable[MetricDef]) -> list[str]:
    lines = ["| name | type | labels | what |", "|---|---|---|---|"]
    for m in defs:
        labels = ", ".join(f"`{x}`" for x in m.labels) or "-"
        lines.append(f"| `{m.name}` | {m.kind} | {labels} | {m.help} |")
    return lines


def render_markdown() -> str:
    """docs/metrics.md, generated from the definitions above."""
    def buckets(b: tuple[float, ...]) -> str:
        return ", ".join(f"{x:g}" for x in b)

    lines = [
        "# Metrics",
        "",
        "<!-- Generated from kvtiers/metrics_defs.py by `python -m kvtiers.metrics.defs`;"
        " tests/ops/test_metrics_docs.py keeps it equal. Do not edit by hand. -->",
        "",
        "kvtiers exports Prometheus metrics through `prometheus_client` (the extra "
        "`kvtiers-core[metrics]`): `kvtiers bench --metrics-port N` and `kvtiers serve "
        "--metrics-port N` serve them on `http://127.0.0.1:N/metrics` while they run "
        "(0: a free port, printed); in your own process, "
        "`kvtiers.metrics.prometheus.MetricsExporter` does the same. Counters end in "
        "`_total`, sizes are in bytes, durations in seconds.",
        "",
        "Counters and gauges read from `stats()` come from a snapshot the scheduler "
        "thread publishes (at most every `publish_interval_s`, 0.5 s by default), so a "
        "scrape never calls into the manager or a tier; histograms and the events "
        "columns are recorded as they happen, without a lock the tiers' threads could "
        "hold.",
        "",
        "## Per tier",
        "",
        "Every series has the label `tier`: the tier's name in the stack (`fs`, `fs#2`).",
        "",
        *_table(TIER_METRICS),
        "",
        "## Per manager (the CPU pool and the scheduler's calls)",
        "",
        *_table(MANAGER_METRICS),
        "",
        "## Histogram buckets",
        "",
        f"- scheduler calls (`kvtiers_manager_call_seconds`): {buckets(CALL_BUCKETS)}",
        f"- tier jobs and probes (`kvtiers_tier_job_seconds`, "
        f"`kvtiers_tier_probe_seconds`): {buckets(JOB_BUCKETS)}",
        "",
        "## Cost, and switching per-call timing off",
        "",
        "Every event is a dict update in the recording thread's own shard. Timing the "
        "scheduler's calls (`kvtiers_manager_call_seconds`) adds two clock reads and a "
        "histogram update to each call into the manager - "
        f"{CALL_TIMING_COST} - which a hot scheduler may not want. The config's "
        "`metrics` section turns it off:",
        "",
        "```json",
        '{"cpu_bytes_to_use": 2147483648, "metrics": {"scheduler_call_timing": false}}',
        "```",
        "",
        "Then the calls go straight to the manager (no wrapper), "
        "`kvtiers_manager_call_seconds` stays empty, and every counter and gauge above "
        "still counts (the tiers' lookups by answer and job latencies included: "
        "those are recorded per tier, not per scheduler call).",
        "",
        "## Reporting from a tier",
        "",
        "A tier reports through `TierContext.metrics` (a `MetricsSink`), already "
        "labelled with its `tier`. The event names it may use, and the metric each "
        "feeds:",
        "",
        "| event | call | metric |",
        "|---|---|---|",
        *[f"| `{m.event}` | `{'observe' if m.kind == 'histogram' else 'count'}` | "
          f"`{m.name}` |" for m in ALL_METRICS if m.event not in (None, "-")],
        "",
        "A name not in this table is dropped and counted in "
        "`kvtiers_metrics_unknown_events_total`.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_markdown(), end="")
