"""A registry for config tests: the core's built-ins plus throwaway tiers whose
schemas exercise what the loader must handle (nested tier sections, lists of them,
vLLM aliases, nested defaults, a broken schema, a class that cannot be imported)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from kvtiers.config import KvtiersConfig, load_config
from kvtiers.contract import CONTRACT_VERSION
from kvtiers.errors import ConfigError
from kvtiers.plugins import Registered, Registry, TierRecord, load_registry

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30


class PlainTier:
    verifies = False


class VerifyingTier:
    verifies = True


DISK_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["root_dir"],
    "properties": {
        "root_dir": {"type": "string", "minLength": 1, "description": "where blocks go"},
        "capacity_bytes": {"type": "integer", "minimum": 1, "default": 10 * GiB},
        "threads": {
            "type": "object",
            "additionalProperties": False,
            "default": {},
            "properties": {
                "load": {"type": "integer", "minimum": 1, "default": 4},
                "store": {"type": "integer", "minimum": 1, "default": 2},
            },
        },
        "eviction_policy": {"type": "string", "x-kvtiers": "policy", "default": "lru"},
    },
}

WRAP_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["inner"],
    "properties": {
        "inner": {"x-kvtiers": "tier", "description": "the wrapped tier"},
        "mirrors": {"type": "array", "items": {"x-kvtiers": "tier"}, "default": []},
        "rate": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
    },
}


def _add(registry: Registry, record: TierRecord) -> None:
    registry.tiers[record.name] = Registered(record, "tests", "kvtiers-tests", "0")


@pytest.fixture(scope="session")
def registry() -> Registry:
    reg = load_registry(entry_points=[], environ={})
    _add(
        reg,
        TierRecord(
            "disk",
            PlainTier,
            DISK_SCHEMA,
            "fake disk tier",
            CONTRACT_VERSION,
            aliases={"n_read_threads": "threads.load", "n_write_threads": "threads.store"},
        ),
    )
    _add(reg, TierRecord("wrap", VerifyingTier, WRAP_SCHEMA, "fake wrapper", CONTRACT_VERSION))
    _add(
        reg, TierRecord("checked", VerifyingTier, {"type": "object"}, "verifies", CONTRACT_VERSION)
    )
    _add(
        reg,
        TierRecord(
            "ghost",
            "kvtiers_no_such_module:Ghost",
            {"type": "object"},
            "cannot import",
            CONTRACT_VERSION,
        ),
    )
    _add(reg, TierRecord("badschema", PlainTier, {"type": 12}, "broken schema", CONTRACT_VERSION))
    _add_vllm_forms(reg)
    return reg


def _add_vllm_forms(registry: Registry) -> None:
    """kvtiers-vllm's forms of vLLM's config (its spec, its tier entry), registered
    as its `kvtiers` entry point registers them: this registry loads no entry point."""
    try:
        from kvtiers_vllm import config_forms
    except ImportError:  # kvtiers-vllm not installed: its forms are unknown
        return
    for spec in config_forms.kvtiers_register_vllm_specs():
        registry.vllm_specs[spec.name] = Registered(spec, "vllm", "kvtiers-vllm", "0")
    for tier in config_forms.kvtiers_register_vllm_tiers():
        registry.vllm_tiers[tier.name] = Registered(tier, "vllm", "kvtiers-vllm", "0")


@pytest.fixture()
def load(registry: Registry):
    """`load(doc)`: load_config against the test registry."""

    def _load(source: Any, **kw: Any) -> KvtiersConfig:
        return load_config(source, registry, **kw)

    return _load


@pytest.fixture()
def problems(registry: Registry):
    """`problems(doc)`: the error lines a bad config produces, as the CLI prints them."""

    def _problems(source: Any, **kw: Any) -> list[str]:
        with pytest.raises(ConfigError) as info:
            load_config(source, registry, **kw)
        return [str(p) for p in info.value.problems]

    return _problems
