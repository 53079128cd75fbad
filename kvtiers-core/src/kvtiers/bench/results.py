"""What one bench run measured, as plain data: counters the replay accumulates,
the manager's and tiers' stats at the end, latency percentiles and a time series.
`RunResult.as_dict()` is what `--json` writes (per run)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CPU = "cpu"  # the CPU pool, as a tier name in the results
GPU = "gpu"  # the GPU <-> CPU pool data path (the DeviceSwapper)


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50/p99/mean/max of samples in seconds, reported in microseconds."""
    if not samples:
        return {"n": 0, "p50_us": 0.0, "p99_us": 0.0, "mean_us": 0.0, "max_us": 0.0}
    a = np.asarray(samples) * 1e6
    p50, p99 = np.percentile(a, [50, 99])
    return {
        "n": len(a),
        "p50_us": float(p50),
        "p99_us": float(p99),
        "mean_us": float(a.mean()),
        "max_us": float(a.max()),
    }


def rate(nbytes: int, seconds: float) -> float:
    """GB/s (10^9 bytes per second); 0 when nothing was timed."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


@dataclass
class Counters:
    """What the replay counts itself (the engine's view)."""

    requests: int = 0
    prompt_tokens: int = 0
    recomputed_tokens: int = 0
    served_tokens: dict[str, int] = field(default_factory=dict)  # tier -> tokens
    served_blocks: dict[str, int] = field(default_factory=dict)
    verified_blocks: int = 0
    verified_bytes: int = 0
    stored_blocks: int = 0  # GPU -> pool copies that succeeded
    store_refused: int = 0  # prepare_store said "not now": blocks not offloaded
    waited_requests: int = 0  # asked again later (promotion or probe in flight)
    gave_up_waiting: int = 0  # still waiting after max_wait_s: served what was there
    thrash_admits: int = 0  # stopped waiting: its own promotions evicted each other
    hits_evicted_by_lookup: int = 0  # leading hits lookup_prefix's promotions evicted
    swap_errors: dict[str, int] = field(default_factory=dict)
    lookup_s: list[float] = field(default_factory=list)
    prepare_store_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)

    def serve(self, tier: str, blocks: int, tokens: int) -> None:
        self.served_blocks[tier] = self.served_blocks.get(tier, 0) + blocks
        self.served_tokens[tier] = self.served_tokens.get(tier, 0) + tokens


@dataclass
class Sample:
    """Cumulative numbers at one instant of the run (for the plot)."""

    t: float
    requests: int
    prompt_tokens: int
    served_tokens: dict[str, int]
    bytes: dict[str, int]  # "<tier> <direction>" -> bytes so far

    def as_dict(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "served_tokens": dict(self.served_tokens),
            "bytes": dict(self.bytes),
        }


def direction_bytes(swap_stats: Any, manager_stats: Mapping[str, Any] | None) -> dict[str, int]:
    """Bytes moved so far, per tier and direction, from the swapper's and the
    manager's stats (the keys of the time series)."""
    out: dict[str, int] = {}
    if swap_stats is not None:
        out[f"{GPU} store"] = int(swap_stats.bytes.get("store", 0))
        out[f"{GPU} load"] = int(swap_stats.bytes.get("load", 0))
    if manager_stats is not None:
        for name, t in manager_stats["tiers"].items():
            out[f"{name} write"] = int(t.get("bytes_written", 0))
            out[f"{name} read"] = int(t.get("bytes_read", 0))
    return out


@dataclass
class RunResult:
    label: str
    wall_s: float
    counters: Counters
    tier_names: list[str]
    block_tokens: int
    block_bytes: int
    manager_stats: dict[str, Any] | None
    swap_stats: Any
    samples: list[Sample]
    stand_in: dict[str, Any]
    started_at: float = field(default_factory=time.time)
    #: after the last request: seconds the tiers took to finish what the run queued,
    #: and whether they did (False: the figures miss what was still in flight)
    settle_s: float = 0.0
    settled: bool = True

    # ---------------------------------------------------------------- derived

    @property
    def hit_tokens(self) -> int:
        return sum(self.counters.served_tokens.values())

    def hit_rate(self, tier: str | None = None) -> float:
        c = self.counters
        served = self.hit_tokens if tier is None else c.served_tokens.get(tier, 0)
        return served / c.prompt_tokens if c.prompt_tokens else 0.0

    def transfers(self) -> list[dict[str, Any]]:
        """One row per tier and direction: blocks, bytes, GB/s while busy (bytes over
        the summed seconds of its jobs) and GB/s over the whole run."""
        rows: list[dict[str, Any]] = []
        s = self.swap_stats
        if s is not None:
            for direction, what in (("store", "GPU -> CPU pool"), ("load", "CPU pool -> GPU")):
                b, sec = int(s.bytes.get(direction, 0)), float(s.seconds.get(direction, 0.0))
                rows.append(
                    {
                        "tier": GPU,
                        "direction": direction,
                        "path": what,
                        "blocks": int(s.blocks.get(direction, 0)),
                        "bytes": b,
                        "busy_s": sec,
                        "gbps_busy": rate(b, sec),
                        "gbps_run": rate(b, self.wall_s),
                    }
                )
        if self.manager_stats is not None:
            for name in self.tier_names:
                t = self.manager_stats["tiers"].get(name, {})
                for direction, what, bk, blk, sk in (
                    (
                        "write",
                        f"CPU pool -> {name}",
                        "bytes_written",
                        "blocks_written",
                        "write_seconds",
                    ),
                    ("read", f"{name} -> CPU pool", "bytes_read", "blocks_read", "read_seconds"),
                ):
                    b, sec = int(t.get(bk, 0)), float(t.get(sk, 0.0))
                    rows.append(
                        {
                            "tier": name,
                            "direction": direction,
                            "path": what,
                            "blocks": int(t.get(blk, 0)),
                            "bytes": b,
                            "busy_s": sec,
                            "gbps_busy": rate(b, sec),
                            "gbps_run": rate(b, self.wall_s),
                        }
                    )
        return rows

    def tiers(self) -> dict[str, dict[str, Any]]:
        """Per tier (the CPU pool first): tokens served, hit rate, lookup hits and
        misses, bytes and throughput, evictions, dropped cascades, errors."""
        c = self.counters
        out: dict[str, dict[str, Any]] = {}
        by_tier: dict[str, dict[str, Any]] = {}
        for row in self.transfers():
            d = by_tier.setdefault(row["tier"], {})
            d[f"{row['direction']}_blocks"] = row["blocks"]
            d[f"{row['direction']}_bytes"] = row["bytes"]
            d[f"{row['direction']}_gbps"] = row["gbps_busy"]
            d[f"{row['direction']}_gbps_run"] = row["gbps_run"]
        if self.manager_stats is not None:
            pool = self.manager_stats["pool"]
            out[CPU] = {
                "tokens_served": c.served_tokens.get(CPU, 0),
                "blocks_served": c.served_blocks.get(CPU, 0),
                "hit_rate": self.hit_rate(CPU),
                "hits": pool["hits"],
                "misses": pool["misses"],
                "pending": pool["pending"],
                "retries": pool["retries"],
                "evictions": pool["evictions"],
                "store_refused": pool["store_refused"],
                "stored_blocks": pool["stored_blocks"],
                "resident": pool["resident"],
                "num_slots": pool["num_slots"],
                "bytes_written": by_tier.get(GPU, {}).get("store_bytes", 0),
                "bytes_read": by_tier.get(GPU, {}).get("load_bytes", 0),
                "write_gbps": by_tier.get(GPU, {}).get("store_gbps", 0.0),
                "read_gbps": by_tier.get(GPU, {}).get("load_gbps", 0.0),
                "cascades_dropped": 0,
                "errors": dict(c.swap_errors),
            }
            for name in self.tier_names:
                t = self.manager_stats["tiers"].get(name, {})
                d = by_tier.get(name, {})
                out[name] = {
                    "tokens_served": c.served_tokens.get(name, 0),
                    "blocks_served": c.served_blocks.get(name, 0),
                    "hit_rate": self.hit_rate(name),
                    "hits": t.get("hits", 0),
                    "misses": t.get("misses", 0),
                    "promoted_hits": t.get("promoted_hits", 0),
                    "evictions": t.get("evictions", 0),
                    "bytes_written": d.get("write_bytes", 0),
                    "bytes_read": d.get("read_bytes", 0),
                    "write_gbps": d.get("write_gbps", 0.0),
                    "read_gbps": d.get("read_gbps", 0.0),
                    "write_gbps_run": d.get("write_gbps_run", 0.0),
                    "read_gbps_run": d.get("read_gbps_run", 0.0),
                    "cascaded_blocks": t.get("cascaded_blocks", 0),
                    "cascades_dropped": t.get("cascades_dropped", 0),
                    "cascades_not_admitted": t.get("cascades_not_admitted", 0),
                    "cascade_failures": t.get("cascade_failures", 0),
                    "promotion_failures": t.get("promotion_failures", 0),
                    "timeouts": t.get("timeouts", 0),
                    "errors": dict(t.get("job_errors", {})),
                    "tier_errors": dict(t.get("errors", {})),
                    "usage_bytes": t.get("usage_bytes", 0),
                    "capacity_bytes": t.get("capacity_bytes"),
                    "breaker": t.get("breaker"),
                }
        return out

    def as_dict(self) -> dict[str, Any]:
        c = self.counters
        return {
            "label": self.label,
            "wall_s": self.wall_s,
            "settle": {"seconds": self.settle_s, "finished": self.settled},
            "requests": c.requests,
            "requests_per_s": c.requests / self.wall_s if self.wall_s else 0.0,
            "prompt_tokens": c.prompt_tokens,
            "recomputed_tokens": c.recomputed_tokens,
            "served_tokens": dict(c.served_tokens),
            "hit_rate": {
                "total": self.hit_rate(),
                **{k: self.hit_rate(k) for k in c.served_tokens},
            },
            "tiers": self.tiers(),
            "transfers": self.transfers(),
            "latency": {
                "lookup_prefix": percentiles(c.lookup_s),
                "prepare_store": percentiles(c.prepare_store_s),
                "wait_for_promotion": percentiles(c.wait_s),
            },
            "verified": {
                "blocks": c.verified_blocks,
                "bytes": c.verified_bytes,
                "mismatches": 0,
            },
            "stored_blocks": c.stored_blocks,
            "store_refused": c.store_refused,
            "waited_requests": c.waited_requests,
            "gave_up_waiting": c.gave_up_waiting,
            "thrash_admits": c.thrash_admits,
            "hits_evicted_by_lookup": c.hits_evicted_by_lookup,
            "stand_in_gpu": self.stand_in,
            "manager": self.manager_stats,
            "timeseries": [s.as_dict() for s in self.samples],
        }
