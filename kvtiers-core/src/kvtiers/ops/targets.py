"""The persistent tiers of a config (`persistent_tiers`), and a tier built for one
namespace its store holds (`open_namespace`), for `kvtiers inspect` / `verify`.

Nothing here builds a manager or a pool: a tier is listed from its class's
capability flags, surveyed through the class method `SecondaryTier.survey`, and
only `verify` builds an instance, for each namespace, with a pool view of one slot
(it never loads or stores through it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers.config.model import KvtiersConfig, TierSection
from kvtiers.contract.inventory import NamespaceInventory
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.contract.tier import SecondaryTier, TierContext
from kvtiers.errors import KvtiersError
from kvtiers.manager.build import tier_names
from kvtiers.plugins.registry import Registry, get_registry


class NoPersistentTier(KvtiersError):
    """The config has no persistent tier (or none of the name asked for)."""


class TierLacksMethods(KvtiersError):
    """A persistent tier's class does not implement an optional method the command
    needs (`NEEDS`)."""


#: the optional methods of `SecondaryTier` each command calls, beyond the required
#: ones: `survey` (a classmethod: list the store without building the tier),
#: `verify_blocks`, `inventory` (what a built tier holds, hottest first)
NEEDS: dict[str, tuple[str, ...]] = {
    "inspect": ("survey",),
    "verify": ("survey", "verify_blocks"),
    "snapshot save": ("survey", "inventory"),
    "snapshot load": (),
}

_WHAT = {
    "survey": "the classmethod survey(config, *, name, ages) -> TierInventory: every "
              "namespace of the store, read without building the tier",
    "verify_blocks": "verify_blocks(*, repair, progress) -> list[VerifyReport]: re-read "
                     "and re-check every block",
    "inventory": "inventory(*, ages) -> TierInventory: what the built tier holds",
}


def missing_methods(cls: type[SecondaryTier], command: str) -> list[str]:
    """The optional methods `command` needs that `cls` leaves to `SecondaryTier`'s
    defaults (which raise NotImplementedError)."""
    def overrides(name: str) -> bool:
        for klass in cls.__mro__:
            if klass is SecondaryTier:
                return False
            if name in vars(klass):
                return True
        return False

    return [name for name in NEEDS.get(command, ()) if not overrides(name)]


@dataclass(frozen=True)
class Target:
    """One persistent tier of the config: its name in the stack, section, class."""

    name: str
    section: TierSection
    cls: type[SecondaryTier]


def persistent_tiers(config: KvtiersConfig, only: str | None = None, *,
                     command: str, registry: Registry | None = None) -> list[Target]:
    """The config's persistent tiers, and those whose store can be surveyed (a
    shared store that outlives the engine), in config order (only `only`, by name);
    `NoPersistentTier` with a message saying what the config has otherwise, and
    `TierLacksMethods` naming the optional methods `command` needs (`NEEDS`) that a
    tier it would work on does not implement - before any work."""
    reg = registry or get_registry()
    found: list[Target] = []
    listed: list[str] = []
    for name, section in zip(tier_names(config), config.secondary_tiers, strict=True):
        cls = reg.get_tier(section.type).record.load()
        # A tier over a shared store that outlives the engine (mooncake) keeps no index
        # across restarts, yet its store can be surveyed: it counts here too.
        persistent = isinstance(cls, type) and issubclass(cls, SecondaryTier) and (
            cls.persistent or not missing_methods(cls, "inspect"))
        listed.append(f"{name} ({'persistent' if persistent else 'not persistent'})")
        if persistent:
            found.append(Target(name, section, cls))
    if not found:
        has = ", ".join(listed) if listed else "no secondary tiers, only the CPU pool"
        raise NoPersistentTier(
            f"kvtiers {command}: the config has no persistent tier ({has}); it works on "
            "tiers whose blocks outlive the process, such as fs")
    if only is not None:
        chosen = [t for t in found if t.name == only]
        if not chosen:
            raise NoPersistentTier(
                f"kvtiers {command}: no persistent tier named {only!r}; choose one of: "
                + ", ".join(t.name for t in found))
        found = chosen
    # `snapshot` works on the first (or the chosen) tier, inspect and verify on all
    for t in found[:1] if command.startswith("snapshot") else found:
        missing = missing_methods(t.cls, command)
        if missing:
            others = [o.name for o in found if o is not t]
            raise TierLacksMethods(
                f"kvtiers {command}: tier {t.name} ({t.section.type}, class "
                f"{t.cls.__module__}.{t.cls.__qualname__}) does not implement "
                + "; ".join(f"{m} ({_WHAT[m]})" for m in missing)
                + f". `kvtiers {command}` needs "
                + " and ".join(NEEDS[command]) + " (inspect: survey; verify: survey and "
                "verify_blocks; snapshot save: survey and inventory), optional methods of "
                "kvtiers.sdk.SecondaryTier its plugin can add"
                + (f"; or choose another tier with --tier ({', '.join(others)})"
                   if others else ""))
    return found


def namespace_of(ns: NamespaceInventory) -> Namespace | None:
    """The `Namespace` a surveyed namespace describes (model, revision, geometry),
    or None when its description is missing or does not give its fingerprint back
    (another format version, a damaged file)."""
    if not ns.model or not ns.geometry:
        return None
    try:
        groups = tuple(BlockGeometry(**dict(g)) for g in ns.geometry)
        namespace = Namespace(ns.model, groups, ns.revision or "")
    except (TypeError, ValueError):
        return None
    return namespace if namespace.fingerprint == ns.namespace else None


def is_ours(ns: NamespaceInventory, config: KvtiersConfig) -> bool:
    """Whether the namespace is the config's model's (`model` in the config)."""
    return config.model is not None and ns.model == config.model


@contextlib.contextmanager
def open_namespace(target: Target, namespace: Namespace,
                   registry: Registry | None = None, *,
                   slots: int = 1) -> Iterator[SecondaryTier]:
    """The tier of `target` built for `namespace` (it joins the store as any engine
    of that model would), with a private pool of `slots`, closed afterwards."""
    from kvtiers.contract import create_tier

    block_bytes = max(g.block_bytes for g in namespace.groups)
    ctx = TierContext(PoolView.anonymous(slots, block_bytes), namespace,
                      logger=logging.getLogger(f"kvtiers.ops.{target.name}"),
                      name=target.name)
    tier = create_tier(target.section, ctx, registry)
    try:
        yield tier
    finally:
        tier.close()


def survey(target: Target, *, ages: bool) -> tuple[NamespaceInventory, ...]:
    """`target`'s store, every namespace (`SecondaryTier.survey`); a tier that
    cannot survey raises `KvtiersError` naming it."""
    options: Mapping[str, Any] = target.section.options
    try:
        return target.cls.survey(options, name=target.name, ages=ages).namespaces
    except NotImplementedError as exc:
        raise KvtiersError(
            f"tier {target.name} ({target.section.type}) cannot list what its store "
            f"holds: {exc}") from exc
    except OSError as exc:
        raise KvtiersError(f"tier {target.name}: cannot read its store: {exc}") from exc


__all__ = ["NEEDS", "NoPersistentTier", "Target", "TierLacksMethods", "is_ours",
           "missing_methods", "namespace_of", "open_namespace", "persistent_tiers", "survey"]
