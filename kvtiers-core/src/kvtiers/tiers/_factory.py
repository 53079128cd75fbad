"""`create_tier`: from a validated tier section to a running tier, by registered name."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from kvtiers.config.model import TierSection
from kvtiers.errors import PluginError, UnknownNameError
from kvtiers.plugins.registry import Registry, get_registry
from kvtiers.tier import SecondaryTier, TierContext

# The registry of the `create_tier` call in progress, so that a tier building a
# nested tier while it is constructed (the `faulty` tier's `inner`) resolves names in
# the same registry as its caller, though a tier's constructor only gets (ctx, config).
_building_with: contextvars.ContextVar[Registry | None] = contextvars.ContextVar(
    "kvtiers_building_with", default=None
)


def create_tier(
    section: TierSection, ctx: TierContext, registry: Registry | None = None
) -> SecondaryTier:
    """Build the tier `section.type` as `cls(ctx, section.options)`.

    `registry` defaults to the registry of an enclosing `create_tier` call, else the
    process-wide one. Unknown names raise `UnknownNameError` (listing the installed
    tiers, with a did-you-mean and an install hint); a plugin that cannot be used
    raises `PluginError`; both name the section's JSON path. Errors the tier's
    constructor raises (`ConfigError` for a bad option) propagate unchanged.
    """
    if registry is None:
        registry = current_registry()
    try:
        registered = registry.get_tier(section.type)
        cls = registered.record.load()
    except (PluginError, UnknownNameError) as exc:
        raise type(exc)(f"{section.path}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, SecondaryTier)):
        raise PluginError(
            f"{section.path}: tier {section.type!r} from {registered.distribution} names "
            f"{cls!r}, which is not a kvtiers.SecondaryTier subclass"
        )
    with _building(registry):
        return cls(ctx, section.options)


def current_registry() -> Registry:
    """The registry of the `create_tier` call in progress, else the process-wide one.
    Tiers resolve names they are configured with (policies, nested tiers) here."""
    return _building_with.get() or get_registry()


@contextmanager
def _building(registry: Registry) -> Iterator[None]:
    token = _building_with.set(registry)
    try:
        yield
    finally:
        _building_with.reset(token)
