"""kvtiers-vllm teaches kvtiers' config reader its vLLM forms through the core's
plugin hooks (`kvtiers_register_vllm_specs`, `kvtiers_register_vllm_tiers`): the
core knows vLLM's own names only. Checked with the installed entry points (what
`kvtiers validate` sees), without kvtiers-vllm's forms, and with another plugin's."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kvtiers.config import load_config
from kvtiers.contract import CONTRACT_VERSION
from kvtiers.errors import ConfigError
from kvtiers.plugins import VllmSpecRecord, VllmTierRecord, hookimpl, load_registry

MEMORY = {"type": "memory", "capacity_bytes": 1 << 20}


def spec_doc(root: Path, tier: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    tier = tier or {"type": "fs", "root_dir": str(root), "capacity_bytes": 1 << 26}
    return {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "KvtiersOffloadingSpec", "cpu_bytes_to_use": 1 << 28,
            "secondary_tiers": [tier], **options,
        },
    }  # fmt: skip


def entry_doc(
    root: Path, entry_type: str = "kvtiers", tier: dict[str, Any] | None = None, **entry: Any
) -> dict[str, Any]:
    tier = tier or {"type": "fs", "root_dir": str(root), "capacity_bytes": 1 << 26}
    return {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1 << 28,
        "secondary_tiers": [{"type": entry_type, "tier": tier, **entry}],
    }  # fmt: skip


def test_the_installed_entry_point_registers_kvtiers_vllms_forms() -> None:
    registry = load_registry()
    spec = registry.vllm_specs["KvtiersOffloadingSpec"]
    tier = registry.vllm_tiers["kvtiers"]
    assert spec.distribution == tier.distribution == "kvtiers-vllm"
    assert spec.record.package == "kvtiers_vllm" and "kvtiers_worker" in spec.record.options
    assert (tier.record.class_name, tier.record.module) == ("KvtiersTier", "kvtiers_vllm.tier")
    kinds = {(row["kind"], row["name"]) for row in registry.listing() if row["status"] == "ok"}
    assert {("vllm_spec", "KvtiersOffloadingSpec"), ("vllm_tier", "kvtiers")} <= kinds


def test_kvtiers_validate_reads_the_spec_and_strips_its_own_keys(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    doc = spec_doc(tmp_path, kvtiers_worker="kvtiers", store_threshold=2, canonical_layout=False)
    path.write_text(json.dumps(doc))
    run = subprocess.run(
        [sys.executable, "-m", "kvtiers", "validate", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ignored" not in run.stdout + run.stderr  # the spec's keys are known
    cfg = load_config(doc)
    assert not cfg.warnings and [s.type for s in cfg.secondary_tiers] == ["fs"]


def test_the_spec_options_are_checked_by_kvtiers_vllms_schemas(tmp_path: Path) -> None:
    doc = spec_doc(tmp_path, kvtiers_worker="gpu", store_threshold=-1, canonical_layout="yes")
    with pytest.raises(ConfigError) as info:
        load_config(doc)
    text = str(info.value)
    for key in ("kvtiers_worker", "store_threshold", "canonical_layout"):
        assert f"$.kv_connector_extra_config.{key}: expected" in text


def test_under_vllms_spec_vllms_own_keys_are_not_said_to_be_the_plugins(tmp_path: Path) -> None:
    doc = spec_doc(tmp_path, kvtiers_worker="kvtiers", canonical_layout=True)
    doc["kv_connector_extra_config"]["spec_name"] = "TieringOffloadingSpec"
    warnings = load_config(doc).warnings
    assert any("kvtiers_worker: only KvtiersOffloadingSpec reads" in w for w in warnings)
    assert not any("canonical_layout: only" in w for w in warnings)


def test_without_kvtiers_vllms_forms_they_are_unknown(tmp_path: Path) -> None:
    bare = load_registry(entry_points=[], environ={})
    with pytest.raises(ConfigError, match='spec_name: is "KvtiersOffloadingSpec"'):
        load_config(spec_doc(tmp_path), bare)
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.type: unknown tier 'kvtiers'"):
        load_config(entry_doc(tmp_path), bare)


# Another plugin's forms, through the same hooks (this module is the plugin).


@hookimpl
def kvtiers_register_vllm_specs() -> list[VllmSpecRecord]:
    options = {"acme_lanes": {"type": "integer", "minimum": 1}}
    return [VllmSpecRecord("AcmeSpec", "acme_vllm", "acme's spec", CONTRACT_VERSION, options)]


@hookimpl
def kvtiers_register_vllm_tiers() -> list[VllmTierRecord]:
    options = {"lane": {"type": "integer"}}
    return [
        VllmTierRecord(
            "acme", "AcmeTier", "acme_vllm.tier", "acme's entry", CONTRACT_VERSION,
            inner_key="wrapped", options=options,
        )
    ]  # fmt: skip


def test_another_plugin_contributes_its_forms_through_the_hooks(tmp_path: Path) -> None:
    ep = md.EntryPoint(name="acme", value=__name__, group="kvtiers")
    registry = load_registry(entry_points=[ep], environ={})
    doc = spec_doc(tmp_path, MEMORY, acme_lanes=4)
    doc["kv_connector_extra_config"]["spec_name"] = "AcmeSpec"
    assert not load_config(doc, registry).warnings
    doc["kv_connector_extra_config"].update(acme_lanes=0, spec_module_path="other.mod")
    with pytest.raises(ConfigError) as info:
        load_config(doc, registry)
    text = str(info.value)
    assert "acme_lanes: expected an integer >= 1" in text
    assert "spec_module_path: is \"other.mod\"" in text and "acme_vllm" in text
    entry = entry_doc(tmp_path, "AcmeTier", MEMORY, module_path="acme_vllm.tier", lane=2, colour=1)
    entry["secondary_tiers"][0]["wrapped"] = entry["secondary_tiers"][0].pop("tier")
    cfg = load_config(entry, registry)
    (section,) = cfg.secondary_tiers
    assert section.type == "memory" and section.path.endswith("secondary_tiers[0].wrapped")
    assert any("secondary_tiers[0].colour: not an option" in w for w in cfg.warnings)


def test_the_spec_says_so_when_its_forms_are_not_registered(
    monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    """kvtiers-vllm's `kvtiers` entry point disabled or missing: the engine's start
    fails saying what to fix, not with an unknown-spec config error."""
    from kvtiers_vllm import spec

    from tests.vllm import harness as h
    from tests.vllm.test_spec import extra

    monkeypatch.setattr(spec, "get_registry", lambda: load_registry(entry_points=[], environ={}))
    with pytest.raises(ValueError, match="kvtiers' config reader does not know this spec"):
        h.Engine(model_dir, extra(16)).close()
