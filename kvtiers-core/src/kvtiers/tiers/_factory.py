"""`create_tier`: from a validated tier section to a running tier, by registered name."""

from __future__ import annotations

import dataclasses

from kvtiers.config.model import TierSection
from kvtiers.errors import PluginError, UnknownNameError
from kvtiers.plugins.registry import Registry
from kvtiers.tier import SecondaryTier, TierContext


def create_tier(
    section: TierSection, ctx: TierContext, registry: Registry | None = None
) -> SecondaryTier:
    """Build the tier `section.type` as `cls(ctx, section.options)`.

    Names resolve in `registry`, else in `ctx.registry`, else in the process-wide
    registry; the tier gets a context that carries that registry, so the names in
    its own config (policies, nested tiers: `ctx.make_policy`, `ctx.build_tier`)
    resolve in the same one. Unknown names raise `UnknownNameError` (listing the
    installed tiers, with a did-you-mean and an install hint); a plugin that cannot
    be used raises `PluginError`; both name the section's JSON path. Errors the
    tier's constructor raises (`ConfigError` for a bad option) propagate unchanged.
    """
    if registry is not None and ctx.registry is not registry:
        ctx = dataclasses.replace(ctx, registry=registry)
    reg = ctx.get_registry()
    try:
        registered = reg.get_tier(section.type)
        cls = registered.record.load()
    except (PluginError, UnknownNameError) as exc:
        raise type(exc)(f"{section.path}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, SecondaryTier)):
        raise PluginError(
            f"{section.path}: tier {section.type!r} from {registered.distribution} names "
            f"{cls!r}, which is not a kvtiers.SecondaryTier subclass"
        )
    return cls(ctx, section.options)
