"""`create_tier` and the built-in tiers' registrations (records and schemas)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest
from kvtiers import PluginError, SecondaryTier, TierContext
from kvtiers.config.model import TierSection
from kvtiers.contract import CONTRACT_VERSION, create_tier
from kvtiers.errors import UnknownNameError
from kvtiers.plugins import Registered, TierRecord, get_registry
from kvtiers.plugins.registry import Registry
from kvtiers.testing import make_context
from kvtiers.tiers import FaultyTier, MemoryTier

BB = 16384


@pytest.fixture
def ctx() -> TierContext:
    return make_context(BB, 8)


def registry_with(name: str, cls: str | type) -> Registry:
    registry = Registry()
    registry.tiers.update(get_registry().tiers)
    registry.policies.update(get_registry().policies)
    record = TierRecord(name, cls, {"type": "object"}, "test", CONTRACT_VERSION)
    registry.tiers[name] = Registered(record, "test-plugin", "kvtiers-test", "0")
    return registry


def test_builds_a_registered_tier_with_its_options(ctx: TierContext) -> None:
    tier = create_tier(TierSection("memory", {"capacity_bytes": 4 * BB}), ctx)
    try:
        assert isinstance(tier, MemoryTier) and tier.ctx is ctx
        assert tier.capacity_bytes == 4 * BB
    finally:
        tier.close()


def test_unknown_name_suggests_and_names_the_path(ctx: TierContext) -> None:
    section = TierSection("memroy", {}, "$.secondary_tiers[2]")
    with pytest.raises(UnknownNameError) as err:
        create_tier(section, ctx)
    message = str(err.value)
    assert message.startswith("$.secondary_tiers[2]: ")
    assert "did you mean 'memory'" in message and "faulty" in message


def test_known_plugin_tier_gets_an_install_hint(ctx: TierContext) -> None:
    with pytest.raises(UnknownNameError, match="install kvtiers-s3"):
        create_tier(TierSection("s3", {}), ctx, Registry())


def test_unimportable_class_is_a_plugin_error(ctx: TierContext) -> None:
    registry = registry_with("ghost", "kvtiers_no_such_module:GhostTier")
    with pytest.raises(PluginError, match=r"^\$\.x: .*kvtiers_no_such_module"):
        create_tier(TierSection("ghost", {}, "$.x"), ctx, registry)


def test_a_class_that_is_not_a_tier_is_a_plugin_error(ctx: TierContext) -> None:
    registry = registry_with("dict", dict)
    with pytest.raises(PluginError, match="not a kvtiers.SecondaryTier subclass"):
        create_tier(TierSection("dict", {}), ctx, registry)


class _Recorder(MemoryTier):
    built: list[Mapping[str, Any]] = []

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        type(self).built.append(config)
        super().__init__(ctx, config)


def test_uses_the_given_registry_for_nested_tiers(ctx: TierContext) -> None:
    registry = registry_with("recorder", _Recorder)
    inner = {"type": "recorder", "capacity_bytes": BB}
    tier = create_tier(TierSection("faulty", {"inner": inner}), ctx, registry)
    try:
        assert isinstance(tier, FaultyTier) and isinstance(tier.inner, _Recorder)
        assert _Recorder.built == [{"capacity_bytes": BB}]
    finally:
        tier.close()
    # Outside that call, the process-wide registry again: no 'recorder' there.
    with pytest.raises(UnknownNameError):
        create_tier(TierSection("faulty", {"inner": inner}), ctx)


# The records the core registers.


@pytest.mark.parametrize("name", ["memory", "faulty"])
def test_builtin_records(name: str) -> None:
    registered = get_registry().get_tier(name)
    record = registered.record
    assert registered.distribution == "kvtiers-core"
    assert record.contract_version == CONTRACT_VERSION
    assert isinstance(record.cls, str), "built-ins are imported lazily"
    assert issubclass(record.load(), SecondaryTier)
    schema = record.schema
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")
    assert "type" not in schema["properties"]
    for prop_name, prop in schema["properties"].items():
        assert "type" in prop and prop.get("description"), prop_name
        if "default" in prop:
            jsonschema.validate(prop["default"], prop)
        else:
            assert prop_name in schema.get("required", ()), f"{prop_name} has no default"


def test_faulty_inner_is_a_nested_tier_section() -> None:
    schema = get_registry().get_tier("faulty").record.schema
    assert schema["properties"]["inner"]["x-kvtiers"] == "tier"
    assert schema["required"] == ["inner"]


@pytest.mark.parametrize(
    "name, section, valid",
    [
        ("memory", {"capacity_bytes": 1 << 30}, True),
        ("memory", {"capacity_bytes": 1 << 30, "eviction_policy": "lru", "threads": 4}, True),
        ("memory", {}, False),
        ("memory", {"capacity_bytes": 1.5}, False),
        ("memory", {"capacity_bytes": 1 << 30, "type": "memory"}, False),
        ("faulty", {"inner": {"type": "memory"}, "error_rate": 0.1, "hang_s": None}, True),
        ("faulty", {"inner": {"type": "memory"}, "hang_s": 2.5, "ops": ["load"]}, True),
        ("faulty", {"inner": {"type": "memory"}, "miss_rate": -0.1}, False),
        ("faulty", {"inner": {"type": "memory"}, "corrupt_detected": "yes"}, False),
    ],
)
def test_schemas_accept_and_refuse(name: str, section: dict[str, Any], valid: bool) -> None:
    schema = get_registry().get_tier(name).record.schema
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(section))
    assert (not errors) is valid, errors
