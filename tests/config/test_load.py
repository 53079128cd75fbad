"""Valid configs: what `load_config` returns, with every default filled in."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import MappingProxyType

import pytest
from kvtiers.config import BreakerConfig, KvtiersConfig, TierSection, load_config
from kvtiers.config.schema import CORE_SCHEMA

from .conftest import REPO, GiB


def test_minimal_config_gets_every_default(load) -> None:
    cfg = load({"cpu_bytes_to_use": GiB})
    assert cfg == KvtiersConfig(cpu_bytes_to_use=GiB)
    assert cfg.eviction_policy == "lru"
    assert cfg.write_policy == "write_through"
    assert cfg.secondary_tiers == ()
    assert cfg.require_verified_tiers is False
    assert cfg.cascade_queue_blocks is None  # the manager sizes it from the pool
    assert cfg.job_timeout_s == 30.0
    assert cfg.breaker == BreakerConfig(failures=5, cooldown_s=10.0)
    assert cfg.hash_seed == 0 and cfg.model is None
    assert cfg.warnings == () and cfg.source_format == "kvtiers"


def test_dataclass_defaults_are_the_schema_defaults() -> None:
    props = CORE_SCHEMA["properties"]
    cfg = KvtiersConfig(cpu_bytes_to_use=1)
    for key, sub in props.items():
        if "default" in sub and key not in ("secondary_tiers", "breaker", "metrics"):
            assert getattr(cfg, key) == sub["default"], key
    for key, sub in props["breaker"]["properties"].items():
        assert getattr(cfg.breaker, key) == sub["default"]
    for key, sub in props["metrics"]["properties"].items():
        assert getattr(cfg.metrics, key) == sub["default"]


def test_every_key_set(load) -> None:
    doc = {
        "cpu_bytes_to_use": 3 * GiB,
        "eviction_policy": "arc",
        "write_policy": "write_back",
        "secondary_tiers": [{"type": "disk", "root_dir": "/tmp/kv"}],
        "require_verified_tiers": False,
        "cascade_queue_blocks": 128,
        "job_timeout_s": 2.5,
        "breaker": {"failures": 3, "cooldown_s": 1},
        "hash_seed": 2**64 - 1,
        "model": "Qwen/Qwen2.5-7B-Instruct",
    }
    cfg = load(doc)
    assert (cfg.eviction_policy, cfg.write_policy) == ("arc", "write_back")
    assert cfg.cascade_queue_blocks == 128 and cfg.job_timeout_s == 2.5
    assert cfg.breaker == BreakerConfig(3, 1.0)
    assert cfg.hash_seed == 2**64 - 1 and cfg.model == "Qwen/Qwen2.5-7B-Instruct"


def test_tier_defaults_filled_including_nested_objects(load) -> None:
    cfg = load({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "disk", "root_dir": "/kv"}]})
    [tier] = cfg.secondary_tiers
    assert tier == TierSection(
        "disk",
        {
            "root_dir": "/kv",
            "capacity_bytes": 10 * GiB,
            "threads": {"load": 4, "store": 2},
            "eviction_policy": "lru",
        },
        "$.secondary_tiers[0]",
    )
    partial = load(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": [{"type": "disk", "root_dir": "/kv", "threads": {"load": 9}}],
        }
    )
    assert dict(partial.secondary_tiers[0].options["threads"]) == {"load": 9, "store": 2}


def test_nested_tier_sections_become_tier_sections_with_their_paths(load) -> None:
    cfg = load(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": [
                {"type": "checked"},
                {
                    "type": "wrap",
                    "inner": {"type": "wrap", "inner": {"type": "disk", "root_dir": "/a"}},
                    "mirrors": [{"type": "checked"}, {"type": "disk", "root_dir": "/b"}],
                },
            ],
        }
    )
    outer = cfg.secondary_tiers[1]
    assert outer.path == "$.secondary_tiers[1]" and outer.options["rate"] == 0
    middle = outer.options["inner"]
    assert isinstance(middle, TierSection) and middle.path == "$.secondary_tiers[1].inner"
    assert middle.options["inner"].path == "$.secondary_tiers[1].inner.inner"
    assert middle.options["inner"].options["threads"]["load"] == 4
    mirrors = outer.options["mirrors"]
    assert [m.path for m in mirrors] == [
        "$.secondary_tiers[1].mirrors[0]",
        "$.secondary_tiers[1].mirrors[1]",
    ]
    assert [s.type for s in cfg.all_tiers()] == [
        "checked",
        "wrap",
        "wrap",
        "disk",
        "checked",
        "disk",
    ]


def test_builtin_faulty_wraps_memory(load) -> None:
    cfg = load(
        {
            "cpu_bytes_to_use": GiB,
            "secondary_tiers": [
                {
                    "type": "faulty",
                    "error_rate": 0.5,
                    "inner": {"type": "memory", "capacity_bytes": GiB},
                }
            ],
        }
    )
    inner = cfg.secondary_tiers[0].options["inner"]
    assert inner.type == "memory" and inner.path == "$.secondary_tiers[0].inner"
    assert inner.options["capacity_bytes"] == GiB and "eviction_policy" in inner.options


def test_config_is_frozen_and_options_read_only(load) -> None:
    cfg = load({"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "disk", "root_dir": "/kv"}]})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cpu_bytes_to_use = 1  # type: ignore[misc]
    options = cfg.secondary_tiers[0].options
    assert isinstance(options, MappingProxyType)
    with pytest.raises(TypeError):
        options["root_dir"] = "/elsewhere"  # type: ignore[index]
    with pytest.raises(TypeError):
        options["threads"]["load"] = 1  # type: ignore[index]


def test_to_dict_round_trips_and_is_json(load) -> None:
    cfg = load(
        {
            "cpu_bytes_to_use": GiB,
            "model": "m",
            "secondary_tiers": [
                {
                    "type": "wrap",
                    "inner": {"type": "disk", "root_dir": "/kv"},
                    "mirrors": [{"type": "checked"}],
                }
            ],
        }
    )
    doc = json.loads(json.dumps(cfg.to_dict()))
    assert load(doc) == cfg
    assert doc["secondary_tiers"][0]["inner"]["threads"] == {"load": 4, "store": 2}


def test_sources_path_inline_and_mapping(load, tmp_path: Path) -> None:
    doc = {"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "checked"}]}
    path = tmp_path / "kv.json"
    path.write_text(json.dumps(doc))
    by_path, by_str_path, inline, mapping = (
        load(path),
        load(str(path)),
        load("  " + json.dumps(doc)),
        load(doc),
    )
    assert by_path == by_str_path == inline == mapping
    assert (by_path.source, inline.source, mapping.source) == (
        str(path),
        "<inline JSON>",
        "<mapping>",
    )


def test_mapping_source_is_not_mutated(load) -> None:
    doc = {"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "disk", "root_dir": "/kv"}]}
    before = json.dumps(doc, sort_keys=True)
    load(doc)
    assert json.dumps(doc, sort_keys=True) == before


def test_integral_floats_become_ints_where_integers_are_expected(load) -> None:
    cfg = load(
        {
            "cpu_bytes_to_use": 1073741824.0,
            "breaker": {"failures": 2.0},
            "secondary_tiers": [{"type": "disk", "root_dir": "/kv", "capacity_bytes": 5.0}],
        }
    )
    assert type(cfg.cpu_bytes_to_use) is int and type(cfg.breaker.failures) is int
    assert type(cfg.secondary_tiers[0].options["capacity_bytes"]) is int


def test_require_verified_tiers_accepts_verifying_stacks(load) -> None:
    cfg = load(
        {
            "cpu_bytes_to_use": GiB,
            "require_verified_tiers": True,
            "secondary_tiers": [{"type": "wrap", "inner": {"type": "checked"}}],
        }
    )
    assert cfg.require_verified_tiers is True


def test_the_examples_validate() -> None:
    cfg = load_config(REPO / "examples" / "config.json")
    assert [t.type for t in cfg.all_tiers()] == ["memory", "faulty", "memory"]
    assert cfg.warnings == ()
    vllm = load_config(REPO / "examples" / "vllm_kv_transfer_config.json")
    assert vllm.source_format == "vllm_kv_transfer_config"
    assert [t.type for t in vllm.secondary_tiers] == ["memory"]
    assert vllm.vllm_spec == "TieringOffloadingSpec" and vllm.vllm_runs == ()
