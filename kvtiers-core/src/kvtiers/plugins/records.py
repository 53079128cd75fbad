"""What a plugin registers: small records naming a thing, its class, its config
schema and the contract version it was written for."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from kvtiers.errors import PluginError

T = TypeVar("T")


def _resolve(target: str | type) -> type:
    if not isinstance(target, str):
        return target
    cls: type = _import_attr(target, "class", "Class")
    return cls


def _resolve_callable(target: str | Callable[..., T]) -> Callable[..., T]:
    if not isinstance(target, str):
        return target
    fn = _import_attr(target, "function", "function")
    if not callable(fn):
        raise PluginError(f"{target!r} is a {type(fn).__name__}, not a function")
    return cast("Callable[..., T]", fn)


def _import_attr(target: str, what: str, example: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not attr:
        raise PluginError(f"{what} path {target!r} must look like 'package.module:{example}'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise PluginError(f"{module_name!r} has no attribute {attr!r}") from exc


@dataclass(frozen=True)
class TierRecord:
    """A secondary tier. `cls` is the class or a lazy "module:Class" path;
    `schema` is a JSON Schema (draft 2020-12) for the tier's config section without
    its "type" key. A property whose schema carries `"x-kvtiers": "tier"` holds a
    nested tier section (the `faulty` tier's `inner`) and is validated as one.

    `aliases` maps a key of vLLM's tier section to the option it means here, as a
    dotted path (`{"n_read_threads": "threads.load"}`); it is applied only when the
    config is a vLLM `kv_transfer_config`, so that vLLM configs load unchanged.

    `check` (optional; a callable or a lazy "module:function" path) runs the checks
    a schema cannot express against this machine - a directory that must exist and
    be writable, a device that must be there. `check(options)` gets the validated
    section and returns `ConfigProblem`s with paths relative to it ("$.root_dir"),
    and may add `ConfigNote`s (facts for `kvtiers validate` that refuse nothing);
    `load_config` runs it unless machine checks are off (`--skip-machine-checks`)."""

    name: str
    cls: str | type
    schema: Mapping[str, Any]
    description: str
    contract_version: int
    aliases: Mapping[str, str] = field(default_factory=dict)
    check: str | Callable[[Mapping[str, Any]], list[Any]] | None = None

    def load(self) -> type:
        return _resolve(self.cls)

    def load_check(self) -> Callable[[Mapping[str, Any]], list[Any]] | None:
        if self.check is None or callable(self.check):
            return self.check
        return _resolve_callable(self.check)


@dataclass(frozen=True)
class PolicyRecord:
    """An eviction policy: `cls` builds it as `cls(capacity=None | int)`."""

    name: str
    cls: str | type
    description: str
    contract_version: int
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})

    def load(self) -> type:
        return _resolve(self.cls)


@dataclass(frozen=True)
class AdmissionRecord:
    """An admission policy (`kvtiers.admission`): `cls` builds it as
    `cls(capacity_blocks=None | int, **options)`, `options` validated against
    `schema` (the object form of a tier section's `admission`)."""

    name: str
    cls: str | type
    description: str
    contract_version: int
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})

    def load(self) -> type:
        return _resolve(self.cls)


@dataclass(frozen=True)
class CommandRecord:
    """A `kvtiers` sub-command. `add_arguments` fills its argparse sub-parser;
    `run(args)` returns the exit status. Each is a function or, better, a lazy
    "module:function" path: the CLI resolves only the command it runs, so listing
    commands (`kvtiers --help`) imports none of them. Neither may import torch at
    module level."""

    name: str
    help: str
    add_arguments: str | Callable[[argparse.ArgumentParser], None]
    run: str | Callable[[argparse.Namespace], int]
    contract_version: int

    def load_add_arguments(self) -> Callable[[argparse.ArgumentParser], None]:
        return _resolve_callable(self.add_arguments)

    def load_run(self) -> Callable[[argparse.Namespace], int]:
        return _resolve_callable(self.run)


@dataclass(frozen=True)
class VllmSpecRecord:
    """An offloading spec for vLLM's `OffloadingConnector` whose
    `kv_connector_extra_config` is read as a kvtiers config, as vLLM's own
    `TieringOffloadingSpec`'s is (`kvtiers validate` and `load_config` read it).

    `name` is its `spec_name`; `package` where a `spec_module_path` naming it may
    point (that package or a module in it). `options` are JSON Schema properties of
    the extra-config keys the spec reads itself rather than kvtiers' manager: they
    are checked against these schemas and left out of the kvtiers config; under
    another spec they are warned about (that spec ignores them), unless they are
    vLLM's own keys (`kvtiers.config.vllm.VLLM_EXTRA_KEYS`), which vLLM's specs read
    too."""

    name: str
    package: str
    description: str
    contract_version: int
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VllmTierRecord:
    """An entry of vLLM's `secondary_tiers` that runs a kvtiers tier section under
    vLLM's own CPU tier: `{"type": name, inner_key: {a kvtiers tier section},
    ...options}`, or the same with `"type": class_name, "module_path": module`.
    `kvtiers validate` reads the section in `inner_key` as the tier of this config's
    stack (its paths inside vLLM's document) and checks the entry's own keys against
    `options` (JSON Schema properties); a key it does not list is warned about."""

    name: str
    class_name: str
    module: str
    description: str
    contract_version: int
    inner_key: str = "tier"
    options: Mapping[str, Any] = field(default_factory=dict)
