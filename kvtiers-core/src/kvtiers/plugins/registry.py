"""Finding plugins: the core's built-ins plus every entry point in group `kvtiers`.

The built-ins are plugins like any other, in `kvtiers.default_plugins`, loaded by
module name (`DEFAULT_PLUGINS`): this module imports nothing it registers, and no
record is resolved ("module:attr" strings) until something uses it.

The loader iterates the entry points itself so that each plugin fails alone: an
import error, an exception in a hook, a record for another contract version is
recorded as a `PluginFailure` and reported by `kvtiers plugins`; it breaks only a
config that selects what that plugin would have provided. Two distributions
registering one name make that name (only) unusable, with both named; a plugin
registering a built-in name is refused (reported), and the built-in stays.

Environment: `KVTIERS_PLUGINS_DISABLE` (comma-separated entry-point or distribution
names to skip) and `KVTIERS_PLUGINS_ALLOW` (if set, load only these). The core's
built-ins are always loaded.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pluggy

from kvtiers.errors import PluginError, UnknownNameError
from kvtiers.humanize import closest_name
from kvtiers.plugins import hookspecs
from kvtiers.plugins.records import (
    AdmissionRecord,
    CommandRecord,
    PolicyRecord,
    TierRecord,
    VllmSpecRecord,
    VllmTierRecord,
)
from kvtiers.plugins.version import CONTRACT_VERSION

ENTRY_POINT_GROUP = "kvtiers"
ENV_DISABLE = "KVTIERS_PLUGINS_DISABLE"
ENV_ALLOW = "KVTIERS_PLUGINS_ALLOW"
CORE_DISTRIBUTION = "kvtiers-core"
# The core's own plugins, registered before any entry point (plugin name "builtin").
DEFAULT_PLUGINS = (
    "kvtiers.default_plugins.tiers",
    "kvtiers.default_plugins.policies",
    "kvtiers.default_plugins.admission",
    "kvtiers.default_plugins.commands",
)
BUILTIN = "builtin"

R = TypeVar(
    "R", TierRecord, PolicyRecord, AdmissionRecord, CommandRecord, VllmSpecRecord, VllmTierRecord
)

AnyRecord = (
    TierRecord | PolicyRecord | AdmissionRecord | CommandRecord | VllmSpecRecord | VllmTierRecord
)

# hook name -> (kind, record type)
_HOOKS: dict[str, tuple[str, type[AnyRecord]]] = {
    "kvtiers_register_tiers": ("tier", TierRecord),
    "kvtiers_register_policies": ("policy", PolicyRecord),
    "kvtiers_register_admissions": ("admission", AdmissionRecord),
    "kvtiers_register_commands": ("command", CommandRecord),
    "kvtiers_register_vllm_specs": ("vllm_spec", VllmSpecRecord),
    "kvtiers_register_vllm_tiers": ("vllm_tier", VllmTierRecord),
}


@dataclass(frozen=True)
class Registered(Generic[R]):
    """A record plus where it came from."""

    record: R
    plugin: str
    distribution: str
    version: str


@dataclass(frozen=True)
class PluginFailure:
    """A plugin (or one of its records) that could not be used, and why."""

    plugin: str
    distribution: str
    version: str
    reason: str
    kind: str | None = None
    name: str | None = None


@dataclass
class Registry:
    tiers: dict[str, Registered[TierRecord]] = field(default_factory=dict)
    policies: dict[str, Registered[PolicyRecord]] = field(default_factory=dict)
    admissions: dict[str, Registered[AdmissionRecord]] = field(default_factory=dict)
    commands: dict[str, Registered[CommandRecord]] = field(default_factory=dict)
    # Config forms of vLLM's kv_transfer_config that plugins contribute (kvtiers-vllm).
    vllm_specs: dict[str, Registered[VllmSpecRecord]] = field(default_factory=dict)
    vllm_tiers: dict[str, Registered[VllmTierRecord]] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)
    # (kind, name) -> every registration of a name claimed more than once
    conflicts: dict[tuple[str, str], list[Registered[Any]]] = field(default_factory=dict)

    def _table(self, kind: str) -> dict[str, Registered[Any]]:
        tables: dict[str, dict[str, Registered[Any]]] = {
            "tier": self.tiers, "policy": self.policies, "admission": self.admissions,
            "command": self.commands, "vllm_spec": self.vllm_specs, "vllm_tier": self.vllm_tiers,
        }  # fmt: skip
        return tables[kind]

    def get(self, kind: str, name: str) -> Registered[Any]:
        """The registration of `name`, or an error that says what to do instead."""
        table = self._table(kind)
        if name in table:
            return table[name]
        if (kind, name) in self.conflicts:
            dists = " and ".join(
                f"{r.distribution} (plugin {r.plugin!r})" for r in self.conflicts[(kind, name)]
            )
            raise PluginError(
                f"{kind} {name!r} is registered by both {dists}; uninstall one or disable "
                f"it with {ENV_DISABLE}"
            )
        for f in self.failures:
            if f.kind == kind and f.name == name:
                raise PluginError(f"{kind} {name!r} from {f.distribution} is unusable: {f.reason}")
        raise UnknownNameError(unknown_name_message(kind, name, table, self.failures))

    def get_tier(self, name: str) -> Registered[TierRecord]:
        return self.get("tier", name)

    def get_policy(self, name: str) -> Registered[PolicyRecord]:
        return self.get("policy", name)

    def get_admission(self, name: str) -> Registered[AdmissionRecord]:
        return self.get("admission", name)

    def listing(self) -> list[dict[str, Any]]:
        """One row per registered thing and per failure, for `kvtiers plugins`."""
        rows: list[dict[str, Any]] = []
        for kind in ("tier", "policy", "admission", "command", "vllm_spec", "vllm_tier"):
            for name, reg in sorted(self._table(kind).items()):
                rows.append(_row(name, kind, reg, "ok", None))
        for (kind, name), regs in sorted(self.conflicts.items()):
            others = ", ".join(r.distribution for r in regs)
            for reg in regs:
                rows.append(_row(name, kind, reg, "error", f"name registered by {others}"))
        for f in self.failures:
            rows.append(
                {
                    "name": f.name or f.plugin,
                    "kind": f.kind or "plugin",
                    "plugin": f.plugin,
                    "distribution": f.distribution,
                    "version": f.version,
                    "status": "error",
                    "error": f.reason,
                    "description": "",
                }
            )
        return rows


def _row(
    name: str, kind: str, reg: Registered[Any], status: str, error: str | None
) -> dict[str, Any]:
    rec = reg.record
    return {
        "name": name,
        "kind": kind,
        "plugin": reg.plugin,
        "distribution": reg.distribution,
        "version": reg.version,
        "status": status,
        "error": error,
        "description": getattr(rec, "description", None) or getattr(rec, "help", ""),
    }


def unknown_name_message(
    kind: str, name: str, table: Mapping[str, Any], failures: Iterable[PluginFailure] = ()
) -> str:
    """"unknown tier 'fss' (did you mean 'fs'?); installed tiers: fs, memory" plus
    a hint about plugins that failed to load."""
    installed = sorted(table)
    msg = f"unknown {kind} {name!r}"
    close = closest_name(name, installed)
    if close is not None:
        msg += f" (did you mean {close!r}?)"
    plural = "policies" if kind == "policy" else f"{kind}s"
    msg += f"; installed {plural}: {', '.join(installed) or '(none)'}"
    broken = sorted({f.plugin for f in failures if f.name is None})
    if broken:
        msg += f"; plugins that failed to load: {', '.join(broken)} (see `kvtiers plugins`)"
    hint = install_hint(name) if kind == "tier" else None
    if hint:
        msg += f"; {hint}"
    return msg


# Tiers we ship as separate distributions: an install hint when they are missing.
_KNOWN_DISTRIBUTIONS = {"fs": "kvtiers-fs", "s3": "kvtiers-s3", "obj": "kvtiers-s3",
                        "p2p": "kvtiers-p2p"}


def install_hint(tier: str) -> str | None:
    """Where the distribution of one of our own tiers comes from, or None."""
    dist = _KNOWN_DISTRIBUTIONS.get(tier)
    if dist is None:
        return None
    # Not on PyPI yet: the distributions are directories of the kvtiers repository.
    return (
        f"install {dist} to use type {tier!r} (not published yet: `pip install "
        f"./{dist}` in a checkout of the kvtiers repository, after kvtiers-core)"
    )


def _canonical(name: str) -> str:
    """Distribution names compare as PEP 503 normalises them (kvtiers_fs == kvtiers-fs)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _split_env(value: str | None) -> set[str]:
    return {_canonical(v.strip()) for v in (value or "").split(",") if v.strip()}


def load_registry(
    entry_points: Iterable[md.EntryPoint] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Registry:
    """Load the built-ins and the entry points (by default, the installed ones)."""
    environ = os.environ if environ is None else environ
    if entry_points is None:
        entry_points = md.entry_points(group=ENTRY_POINT_GROUP)
    disabled = _split_env(environ.get(ENV_DISABLE))
    allowed = _split_env(environ.get(ENV_ALLOW)) if environ.get(ENV_ALLOW) is not None else None

    registry = Registry()
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    origin: dict[int, tuple[str, str, str]] = {}

    core_version = _core_version()
    for module_name in DEFAULT_PLUGINS:
        try:
            builtin = importlib.import_module(module_name)
            pm.register(builtin, name=f"{BUILTIN}:{module_name}")
        except Exception as exc:  # noqa: BLE001 - reported like any plugin's failure
            registry.failures.append(
                PluginFailure(
                    BUILTIN, CORE_DISTRIBUTION, core_version,
                    f"{module_name}: {type(exc).__name__}: {exc}",
                )
            )
            continue
        origin[id(builtin)] = (BUILTIN, CORE_DISTRIBUTION, core_version)

    for ep in entry_points:
        dist = ep.dist.name if ep.dist is not None else "?"
        version = ep.dist.version if ep.dist is not None else "?"
        names = {_canonical(ep.name), _canonical(dist)}
        if names & disabled or (allowed is not None and not names & allowed):
            continue
        try:
            module = ep.load()
            pm.register(module, name=f"{dist}:{ep.name}")
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            registry.failures.append(
                PluginFailure(ep.name, dist, version, f"{type(exc).__name__}: {exc}")
            )
            continue
        origin[id(module)] = (ep.name, dist, version)

    for hook_name, (kind, record_type) in _HOOKS.items():
        caller = getattr(pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            plugin, dist, version = origin[id(impl.plugin)]
            try:
                records = list(impl.function() or [])
            except Exception as exc:  # noqa: BLE001
                reason = f"{hook_name} raised {type(exc).__name__}: {exc}"
                registry.failures.append(PluginFailure(plugin, dist, version, reason))
                continue
            for rec in records:
                _add(registry, kind, record_type, rec, plugin, dist, version)
    return registry


def _add(
    registry: Registry,
    kind: str,
    record_type: type[AnyRecord],
    rec: object,
    plugin: str,
    dist: str,
    version: str,
) -> None:
    if not isinstance(rec, record_type):
        registry.failures.append(
            PluginFailure(
                plugin, dist, version,
                f"returned {type(rec).__name__} where a {record_type.__name__} was expected",
                kind,
            )
        )
        return
    if rec.contract_version != CONTRACT_VERSION:
        registry.failures.append(
            PluginFailure(
                plugin, dist, version, contract_mismatch(rec.contract_version, dist), kind,
                rec.name,
            )
        )
        return
    reg: Registered[Any] = Registered(rec, plugin, dist, version)
    table = registry._table(kind)
    key = (kind, rec.name)
    held = table.get(rec.name)
    if held is not None and CORE_DISTRIBUTION in (dist, held.distribution):
        # A built-in name is reserved: the core's record stays, the other is refused.
        core, other = (reg, held) if dist == CORE_DISTRIBUTION else (held, reg)
        table[rec.name] = core
        registry.failures.append(
            PluginFailure(
                other.plugin, other.distribution, other.version,
                f"{kind} {rec.name!r} is a built-in of {CORE_DISTRIBUTION}; a plugin must "
                "register another name",
                kind, rec.name,
            )
        )
        return
    if key in registry.conflicts:
        registry.conflicts[key].append(reg)
    elif rec.name in table:
        registry.conflicts[key] = [table.pop(rec.name), reg]
    else:
        table[rec.name] = reg


def contract_mismatch(written_for: object, dist: str) -> str:
    """Why a record for another contract version is refused, and what to do."""
    core = f"this kvtiers-core ({_core_version()})"
    if isinstance(written_for, int) and written_for > CONTRACT_VERSION:
        return (
            f"written for contract version {written_for}, but {core} implements version "
            f"{CONTRACT_VERSION}: upgrade kvtiers-core, or install a release of {dist} "
            f"written for contract version {CONTRACT_VERSION}"
        )
    return (
        f"written for contract version {written_for}, but {core} needs version "
        f"{CONTRACT_VERSION}: upgrade {dist} to a release written for contract version "
        f"{CONTRACT_VERSION}"
    )


def _core_version() -> str:
    try:
        return md.version(CORE_DISTRIBUTION)
    except md.PackageNotFoundError:
        import kvtiers

        return kvtiers.__version__


_cached: Registry | None = None


def get_registry(refresh: bool = False) -> Registry:
    """The process-wide registry, loaded on first use."""
    global _cached
    if _cached is None or refresh:
        _cached = load_registry()
    return _cached
