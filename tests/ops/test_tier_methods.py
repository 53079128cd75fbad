"""`kvtiers inspect`, `verify` and `snapshot` on a third-party persistent tier that
lacks the optional methods they call: refused before any work (exit 2), the message
naming the tier, its class and exactly the methods that would enable the command."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path
from typing import Any

import pytest
from kvtiers.config import load_config
from kvtiers.contract.tier import SecondaryTier
from kvtiers.ops.targets import NEEDS, TierLacksMethods, missing_methods, persistent_tiers
from kvtiers.plugins import CONTRACT_VERSION, TierRecord, hookimpl, load_registry
from kvtiers.tiers.memory import MemoryTier


class KeepsTier(MemoryTier):
    """A persistent tier that implements none of the optional tool methods."""

    persistent = True


class SurveysTier(KeepsTier):
    """... and one that surveys its store, nothing more."""

    @classmethod
    def survey(cls, config: Any, *, name: str = "", ages: bool = False) -> Any:
        raise AssertionError("not called by these tests")


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    schema = {"type": "object", "properties": {"capacity_bytes": {"type": "integer"}}}
    return [TierRecord("keeps", f"{__name__}:KeepsTier", schema, "persistent, no tools",
                       CONTRACT_VERSION),
            TierRecord("surveys", f"{__name__}:SurveysTier", schema, "persistent, survey only",
                       CONTRACT_VERSION)]


def _config(tmp_path: Path, *types: str) -> Any:
    registry = load_registry([md.EntryPoint(name="acme", value=__name__, group="kvtiers")],
                             environ={})
    doc = {"cpu_bytes_to_use": 1 << 20, "model": "m",
           "secondary_tiers": [{"type": t, "capacity_bytes": 1 << 20} for t in types]}
    return load_config(doc, registry, check_machine=False), registry


@pytest.mark.parametrize(("command", "missing"), [
    ("inspect", ["survey"]),
    ("verify", ["survey", "verify_blocks"]),
    ("snapshot save", ["survey", "inventory"]),
])
def test_the_refusal_names_the_methods_each_command_needs(
        tmp_path: Path, command: str, missing: list[str]) -> None:
    config, registry = _config(tmp_path, "keeps")
    with pytest.raises(TierLacksMethods) as info:
        persistent_tiers(config, command=command, registry=registry)
    text = str(info.value)
    assert f"kvtiers {command}: tier keeps (keeps" in text and "KeepsTier" in text
    for name in ("survey", "verify_blocks", "inventory"):
        assert (f"implement {name} (" in text or f"; {name} (" in text) == (name in missing), text
    assert "kvtiers.sdk.SecondaryTier" in text


def test_only_what_is_missing_is_named_and_what_needs_nothing_runs(tmp_path: Path) -> None:
    config, registry = _config(tmp_path, "surveys", "keeps")
    assert missing_methods(SurveysTier, "verify") == ["verify_blocks"]
    assert missing_methods(SurveysTier, "inspect") == []
    with pytest.raises(TierLacksMethods) as info:
        persistent_tiers(config, command="verify", registry=registry)
    text = str(info.value)
    assert "tier surveys (surveys" in text and "verify_blocks (" in text
    assert "implement survey (" not in text
    # inspect fails on the second tier only, and points at --tier
    with pytest.raises(TierLacksMethods, match=r"tier keeps .*--tier \(surveys\)"):
        persistent_tiers(config, command="inspect", registry=registry)
    (target,) = persistent_tiers(config, "surveys", command="inspect", registry=registry)
    assert target.cls is SurveysTier
    # snapshot works on the first tier; load needs no optional method at all
    assert persistent_tiers(config, command="snapshot load", registry=registry)
    assert NEEDS["snapshot load"] == ()


def test_every_in_tree_persistent_tier_has_what_every_command_needs() -> None:
    from kvtiers_fs.tier import FsTier
    from kvtiers_s3.tier import ObjTier, S3Tier

    redis = pytest.importorskip("kvtiers_redis.tier")  # the example tier
    for cls in (FsTier, S3Tier, ObjTier, redis.RedisTier):
        assert issubclass(cls, SecondaryTier) and cls.persistent
        for command in NEEDS:
            assert missing_methods(cls, command) == [], (cls.__name__, command)
