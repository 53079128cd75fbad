"""Building a manager and its tiers from a validated config."""

from __future__ import annotations

import logging

from kvtiers.clock import Clock, monotonic
from kvtiers.config.model import KvtiersConfig
from kvtiers.manager.manager import TieringOffloadingManager
from kvtiers.metrics import MetricsSink, NullMetrics
from kvtiers.namespace import Namespace
from kvtiers.plugins.registry import Registry, get_registry
from kvtiers.pool_view import PoolView
from kvtiers.tier import SecondaryTier, TierContext
from kvtiers.tiers import create_tier


def tier_names(config: KvtiersConfig) -> list[str]:
    """Display names of the configured tiers: their type, numbered when repeated."""
    types = [s.type for s in config.secondary_tiers]
    return [t if types.count(t) == 1 else f"{t}#{types[:i + 1].count(t)}" for i, t in enumerate(types)]


def build_manager(
    config: KvtiersConfig,
    pool: PoolView,
    namespace: Namespace,
    *,
    clock: Clock = monotonic,
    registry: Registry | None = None,
    metrics: MetricsSink | None = None,
    logger: logging.Logger | None = None,
) -> TieringOffloadingManager:
    """The manager for `pool`, with the config's policy and secondary tiers (built in
    config order; if one fails to build, those already built are closed)."""
    registry = registry or get_registry()
    logger = logger or logging.getLogger("kvtiers")
    policy_cls = registry.get_policy(config.eviction_policy).record.load()
    names = tier_names(config)
    tiers: list[SecondaryTier] = []
    try:
        for name, section in zip(names, config.secondary_tiers):
            ctx = TierContext(
                pool, namespace, clock, logger.getChild(name), metrics or NullMetrics(), name
            )
            tiers.append(create_tier(section, ctx, registry))
        return TieringOffloadingManager(
            pool.num_slots,
            policy_cls.for_slots(pool.num_slots),
            tiers,
            write_policy=config.write_policy,
            clock=clock,
            job_timeout_s=config.job_timeout_s,
            cascade_queue_blocks=config.cascade_queue_blocks,
            breaker_failures=config.breaker.failures,
            breaker_cooldown_s=config.breaker.cooldown_s,
            require_verified_tiers=config.require_verified_tiers,
            tier_names=names,
        )
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
