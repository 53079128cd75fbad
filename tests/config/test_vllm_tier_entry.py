"""kvtiers-vllm's tier entry in vLLM's config (`{"type": "kvtiers", "tier": {...}}`,
or `KvtiersTier` from `kvtiers_vllm.tier`): `kvtiers validate` reads the kvtiers tier
inside it, with paths into vLLM's document, and checks the entry's own options."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from kvtiers import ConfigError, load_config


def _doc(root: Path, **entry: Any) -> dict[str, Any]:
    tier = {"type": "fs", "root_dir": str(root), "capacity_bytes": 1 << 26}
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 1 << 28,
            "secondary_tiers": [{"type": "kvtiers", "tier": tier, **entry}],
        },
    }


def test_the_inner_tier_is_the_stack(tmp_path: Path) -> None:
    cfg = load_config(_doc(tmp_path, medium="storage", locality="LOCAL"))
    (section,) = cfg.secondary_tiers
    assert section.type == "fs" and section.options["capacity_bytes"] == 1 << 26
    assert section.path == "$.kv_connector_extra_config.secondary_tiers[0].tier"


def test_the_module_path_form_is_read_the_same(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    entry = doc["kv_connector_extra_config"]["secondary_tiers"][0]
    entry.update(type="KvtiersTier", module_path="kvtiers_vllm.tier")
    (section,) = load_config(doc).secondary_tiers
    assert section.type == "fs"


def test_every_problem_has_its_path(tmp_path: Path) -> None:
    doc = _doc(tmp_path, medium="DISK", enable_kv_events="yes")
    extra = doc["kv_connector_extra_config"]
    extra["secondary_tiers"][0]["tier"]["capacity_bytes"] = -1
    extra["secondary_tiers"].append({"type": "kvtiers"})
    with pytest.raises(ConfigError) as info:
        load_config(doc)
    text = str(info.value)
    base = "$.kv_connector_extra_config.secondary_tiers"
    assert f"{base}[0].medium: expected one of STORAGE, CPU" in text
    assert f"{base}[0].enable_kv_events: expected true or false" in text
    assert f"{base}[0].tier.capacity_bytes: expected an integer >= 1" in text
    assert f"{base}[1].tier: missing" in text


def test_unknown_entry_options_are_warned_about(tmp_path: Path) -> None:
    doc = _doc(tmp_path, colour="blue")
    cfg = load_config(doc)
    assert any("secondary_tiers[0].colour" in w for w in cfg.warnings)


def test_in_a_kvtiers_config_kvtiers_is_no_tier(tmp_path: Path) -> None:
    doc = copy.deepcopy(_doc(tmp_path)["kv_connector_extra_config"])
    del doc["spec_name"]
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.type"):
        load_config(doc)


def _spec_doc(root: Path, spec: str, **options: Any) -> dict[str, Any]:
    doc = _doc(root)
    extra = doc["kv_connector_extra_config"]
    extra["spec_name"] = spec
    extra["secondary_tiers"] = [extra["secondary_tiers"][0]["tier"]]
    extra.update(options)
    return doc


def test_the_kvtiers_spec_options_are_checked(tmp_path: Path) -> None:
    good = _spec_doc(tmp_path, "KvtiersOffloadingSpec", kvtiers_worker="kvtiers",
                     kvtiers_stats_interval_s=0.5, kvtiers_shutdown_drain_s=0)
    assert not load_config(good).warnings
    bad = _spec_doc(tmp_path, "KvtiersOffloadingSpec", kvtiers_worker="gpu",
                    kvtiers_stats_interval_s=-1, kvtiers_shutdown_drain_s=True)
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    text = str(info.value)
    for key in ("kvtiers_worker", "kvtiers_stats_interval_s", "kvtiers_shutdown_drain_s"):
        assert f"$.kv_connector_extra_config.{key}: expected" in text


def test_the_kvtiers_spec_options_are_warned_about_under_vllms_spec(tmp_path: Path) -> None:
    doc = _spec_doc(tmp_path, "TieringOffloadingSpec", kvtiers_worker="kvtiers")
    (warning,) = load_config(doc).warnings
    assert "kvtiers_worker: only KvtiersOffloadingSpec reads this option" in warning
