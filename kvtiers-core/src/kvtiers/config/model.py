"""Typed configuration objects.

All frozen: a config is decided once, before anything starts, and then only read
(from several threads). Tier options are read-only mappings, their lists tuples.
`to_dict()` gives back a plain JSON document that `load_config` accepts, so a vLLM
config can be turned into a kvtiers one (`kvtiers validate --json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kvtiers.config.schema import breaker_default_of, default_of, metrics_default_of
from kvtiers.contract.section import TierSection, freeze, thaw

__all__ = [
    "BreakerConfig",
    "KvtiersConfig",
    "MetricsConfig",
    "TierSection",
    "WritePolicy",
    "freeze",
    "thaw",
]

WritePolicy = Literal["write_through", "write_back"]


@dataclass(frozen=True)
class BreakerConfig:
    """When a failing tier is skipped, and for how long (see `kvtiers.manager`)."""

    failures: int = breaker_default_of("failures")
    cooldown_s: float = breaker_default_of("cooldown_s")


@dataclass(frozen=True)
class MetricsConfig:
    """How metrics are recorded, when something records them (`kvtiers.metrics.instrument`)."""

    scheduler_call_timing: bool = metrics_default_of("scheduler_call_timing")


@dataclass(frozen=True)
class KvtiersConfig:
    """A validated config: everything the manager is built from. Field meanings and
    defaults are those of `kvtiers.config.schema.CORE_SCHEMA` (docs/configuration.md).

    `warnings` (keys accepted but ignored, such as vLLM's), `notes` (what tiers'
    machine checks found worth saying, such as other models' data on a root),
    `source` (a file path,
    `<inline JSON>` or `<mapping>`) and `source_format` (`kvtiers`,
    `vllm_kv_transfer_config` or `vllm_extra_config`) describe the loading, and so
    do `vllm_spec` (the offloading spec a vLLM config names) and `vllm_runs` (the
    `secondary_tiers` indices vLLM runs with its own tiers, under its tiering spec):
    none takes part in equality."""

    cpu_bytes_to_use: int
    eviction_policy: str = default_of("eviction_policy")
    write_policy: WritePolicy = default_of("write_policy")
    secondary_tiers: tuple[TierSection, ...] = ()
    require_verified_tiers: bool = default_of("require_verified_tiers")
    cascade_queue_blocks: int | None = default_of("cascade_queue_blocks")
    job_timeout_s: float = default_of("job_timeout_s")
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    hash_seed: int = default_of("hash_seed")
    model: str | None = default_of("model")
    enable_kv_events: bool = default_of("enable_kv_events")
    warnings: tuple[str, ...] = field(default=(), compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)
    source: str = field(default="<mapping>", compare=False)
    source_format: str = field(default="kvtiers", compare=False)
    vllm_spec: str | None = field(default=None, compare=False)
    vllm_runs: tuple[int, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The config as a kvtiers JSON document, every default written out."""
        return {
            "cpu_bytes_to_use": self.cpu_bytes_to_use,
            "eviction_policy": self.eviction_policy,
            "write_policy": self.write_policy,
            "secondary_tiers": [t.to_dict() for t in self.secondary_tiers],
            "require_verified_tiers": self.require_verified_tiers,
            "cascade_queue_blocks": self.cascade_queue_blocks,
            "job_timeout_s": self.job_timeout_s,
            "breaker": {"failures": self.breaker.failures, "cooldown_s": self.breaker.cooldown_s},
            "metrics": {"scheduler_call_timing": self.metrics.scheduler_call_timing},
            "hash_seed": self.hash_seed,
            "model": self.model,
            "enable_kv_events": self.enable_kv_events,
        }

    def all_tiers(self) -> list[TierSection]:
        """Every tier section, nested ones included, in config order."""
        return [s for t in self.secondary_tiers for s in t.walk()]
