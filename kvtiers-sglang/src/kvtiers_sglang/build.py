"""Building the tier stack of one SGLang rank from its validated options.

Each `secondary_tiers` section becomes its kvtiers tier over the pages' view, with
its namespace, its name in the stack (`fs`, `fs#2` when repeated), a logger, and
metrics labelled with that name (each tier wrapped to record its lookups and jobs,
as under kvtiers' manager); its admission policy is built as the manager builds it,
sized by the tier's capacity in blocks.
"""

from __future__ import annotations

import logging
from typing import Any

from kvtiers import Namespace, PoolView, SecondaryTier, TierContext
from kvtiers.manager import MeteredTier, tier_names
from kvtiers.metrics import MetricsRecorder
from kvtiers.plugins import Registry, get_registry
from kvtiers.sdk import AdmissionPolicy, LabelledSink, TierStats, create_tier

from kvtiers_sglang.options import BackendOptions
from kvtiers_sglang.stack import TierStack

log = logging.getLogger("kvtiers.sglang")


def build_stack(
    options: BackendOptions, view: PoolView, namespace: Namespace, recorder: MetricsRecorder
) -> TierStack:
    """The tiers of `options`, over `view`, in `namespace`; tiers already built are
    closed when a later one fails to build."""
    config = options.config
    registry = get_registry()
    built: list[tuple[str, SecondaryTier, AdmissionPolicy | None]] = []
    try:
        for name, section in zip(tier_names(config), config.secondary_tiers, strict=True):
            ctx = TierContext(view, namespace, logger=log.getChild(name),
                              metrics=LabelledSink(recorder, tier=name), name=name,
                              registry=registry)
            tier = create_tier(section, ctx, registry)
            admission = _admission(registry, section.admission,
                                   dict(section.admission_options), tier, view.block_bytes)
            built.append((name, MeteredTier(tier, name, recorder), admission))
    except BaseException:
        for _, tier, _ in built:
            tier.close()
        raise

    def publish(stats: dict[str, TierStats]) -> None:
        recorder.publish({"tiers": {name: s.as_dict() for name, s in stats.items()}})

    return TierStack(
        built,
        job_timeout_s=config.job_timeout_s,
        exists_wait_s=options.exists_wait_s,
        breaker_failures=config.breaker.failures,
        breaker_cooldown_s=config.breaker.cooldown_s,
        publish=publish,
    )


def _admission(
    registry: Registry, name: str, options: dict[str, Any], tier: SecondaryTier,
    block_bytes: int,
) -> AdmissionPolicy | None:
    """The section's admission policy sized by the tier's capacity in blocks, as
    the manager builds it; None for `all` (every block)."""
    if name == "all" and not options:
        return None
    try:
        capacity = tier.stats().capacity_bytes
    except Exception:  # noqa: BLE001 - a tier that cannot say leaves the default size
        capacity = None
    cls = registry.get_admission(name).record.load()
    if not (isinstance(cls, type) and issubclass(cls, AdmissionPolicy)):
        raise TypeError(f"admission {name!r} is not an AdmissionPolicy")
    policy: AdmissionPolicy = cls(
        capacity_blocks=capacity // block_bytes if capacity else None, **options)
    return policy
