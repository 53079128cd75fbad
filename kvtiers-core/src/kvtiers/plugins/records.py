"""What a plugin registers: small records naming a thing, its class, its config
schema and the contract version it was written for."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtiers.errors import PluginError


def _resolve(target: str | type) -> type:
    if not isinstance(target, str):
        return target
    module_name, _, attr = target.partition(":")
    if not attr:
        raise PluginError(f"class path {target!r} must look like 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        cls: type = getattr(module, attr)
    except AttributeError as exc:
        raise PluginError(f"{module_name!r} has no attribute {attr!r}") from exc
    return cls


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
        return _resolve(self.check)  # type: ignore[return-value]


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
class CommandRecord:
    """A `kvtiers` sub-command. `add_arguments` fills its argparse sub-parser;
    `run(args)` returns the exit status. Both must import no torch at module level."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    contract_version: int
