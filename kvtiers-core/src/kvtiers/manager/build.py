"""Building a manager and its tiers from a validated config."""

from __future__ import annotations

import logging

from kvtiers.admission.base import AdmissionPolicy
from kvtiers.admission.build import build_admission
from kvtiers.config.model import KvtiersConfig, TierSection
from kvtiers.contract import create_tier
from kvtiers.contract.clock import Clock, monotonic
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.contract.metrics import LabelledSink, MetricsSink, NullMetrics
from kvtiers.contract.namespace import Namespace
from kvtiers.contract.pool_view import PoolView, round_up
from kvtiers.contract.tier import SecondaryTier, TierContext
from kvtiers.errors import ConfigError, ConfigProblem, PluginError
from kvtiers.humanize import format_bytes
from kvtiers.manager.manager import TieringOffloadingManager
from kvtiers.manager.metered_tier import MeteredTier
from kvtiers.plugins.registry import Registry, get_registry


def tier_names(config: KvtiersConfig) -> list[str]:
    """Display names of the configured tiers: their type, numbered when repeated."""
    types = [s.type for s in config.secondary_tiers]
    return [
        t if types.count(t) == 1 else f"{t}#{types[: i + 1].count(t)}"
        for i, t in enumerate(types)
    ]


def num_slots_for(config: KvtiersConfig, block_bytes: int) -> int:
    """How many blocks of `block_bytes` the config's `cpu_bytes_to_use` holds: the
    slot count of the pool `CpuPool(block_bytes, cpu_bytes_to_use)` makes (slots are
    blocks rounded up to 4 KiB)."""
    if block_bytes <= 0:
        raise ValueError(f"block_bytes must be positive, got {block_bytes}")
    return config.cpu_bytes_to_use // round_up(block_bytes)


def build_manager(
    config: KvtiersConfig,
    pool: PoolView | None = None,
    namespace: Namespace | None = None,
    *,
    block_bytes: int | None = None,
    clock: Clock = monotonic,
    registry: Registry | None = None,
    metrics: MetricsSink | None = None,
    logger: logging.Logger | None = None,
    enable_events: bool | None = None,
    pinned_in_place: bool = False,
) -> TieringOffloadingManager:
    """The manager for the config's CPU pool, with its policy and secondary tiers
    (built in config order; if one fails to build, those already built are closed).

    `pool`: the pool's view. Its slot count must be what `cpu_bytes_to_use` makes
    of its blocks (`ConfigError` naming both otherwise). Without secondary tiers the
    scheduler side never touches the pool's bytes: then `block_bytes` alone will do,
    and `namespace` is not needed. `enable_events` overrides the config's
    `enable_kv_events`. `metrics`: each tier reports to it labelled with its name,
    and is wrapped in a `MeteredTier` (`kvtiers.manager.metered_tier`). Tiers that
    serve peers (`serves_peers`) get the manager through `serve_external_requests`
    before it is returned. `pinned_in_place`: ask the pool's policy for in-place pins
    (`EvictionPolicy.keep_pinned_in_place`; the manager's `pinned_in_place` says
    whether it has them), for an engine that reports its uses itself."""
    if pool is not None:
        num_slots = _check_pool(config, pool)
    elif block_bytes is not None:
        num_slots = num_slots_for(config, block_bytes)
    else:
        raise TypeError("build_manager needs the pool's view or, without tiers, its block_bytes")
    if config.secondary_tiers and (pool is None or namespace is None):
        missing = " and ".join(
            n for n, v in (("the pool's view", pool), ("a namespace", namespace)) if v is None
        )
        raise TypeError(f"build_manager: secondary tiers are configured, which need {missing}")
    registry = registry or get_registry()
    logger = logger or logging.getLogger("kvtiers")
    policy_cls = registry.get_policy(config.eviction_policy).record.load()
    if not issubclass(policy_cls, EvictionPolicy):
        raise PluginError(
            f"policy {config.eviction_policy!r} is a {policy_cls.__name__}, not an EvictionPolicy"
        )
    names = tier_names(config)
    tiers: list[SecondaryTier] = []
    admissions: list[AdmissionPolicy | None] = []
    try:
        for name, section in zip(names, config.secondary_tiers, strict=True):
            assert pool is not None and namespace is not None
            sink = NullMetrics() if metrics is None else LabelledSink(metrics, tier=name)
            ctx = TierContext(pool, namespace, clock, logger.getChild(name), sink, name)
            tier = create_tier(section, ctx, registry)
            admissions.append(_admission(registry, section, tier, pool.block_bytes))
            # With metrics, each tier is wrapped to record its lookups and jobs.
            tiers.append(tier if metrics is None else MeteredTier(tier, name, metrics))
        policy = policy_cls.for_slots(num_slots)
        if pinned_in_place:
            policy.keep_pinned_in_place()
        manager = TieringOffloadingManager(
            num_slots,
            policy,
            tiers,
            write_policy=config.write_policy,
            clock=clock,
            job_timeout_s=config.job_timeout_s,
            cascade_queue_blocks=config.cascade_queue_blocks,
            breaker_failures=config.breaker.failures,
            breaker_cooldown_s=config.breaker.cooldown_s,
            require_verified_tiers=config.require_verified_tiers,
            tier_names=names,
            enable_events=config.enable_kv_events if enable_events is None else enable_events,
            admissions=admissions,
        )
        # The contract: a tier that serves peers is handed its parent once, by the
        # thread that builds the manager.
        for tier in tiers:
            if tier.serves_peers:
                tier.serve_external_requests(manager)
        return manager
    except BaseException:
        for tier in tiers:
            tier.close()
        raise


def _admission(
    registry: Registry, section: TierSection, tier: SecondaryTier, block_bytes: int
) -> AdmissionPolicy | None:
    """The section's admission policy, sized by the tier's capacity in blocks."""
    if section.admission == "all" and not section.admission_options:
        return None
    try:
        capacity = tier.stats().capacity_bytes
    except Exception:  # noqa: BLE001 - a tier that cannot say leaves the default size
        capacity = None
    blocks = capacity // block_bytes if capacity else None
    return build_admission(registry, section.admission, section.admission_options, blocks)


def _check_pool(config: KvtiersConfig, pool: PoolView) -> int:
    expected = config.cpu_bytes_to_use // pool.slot_bytes
    if pool.num_slots != expected:
        raise ConfigError(ConfigProblem(
            "$.cpu_bytes_to_use",
            f"cpu_bytes_to_use is {config.cpu_bytes_to_use} bytes "
            f"({format_bytes(config.cpu_bytes_to_use)}), which makes {expected} slots of "
            f"{pool.slot_bytes} bytes, but the CPU pool given has "
            f"{pool.num_slots} slots ({pool.nbytes} bytes, {format_bytes(pool.nbytes)}): "
            "build the pool from the same config",
        ))  # fmt: skip
    return expected
