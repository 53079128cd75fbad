"""The registry's promise: each plugin fails alone, and a config that selects a broken
or ambiguous name gets an error that says which distribution to fix.

Plugins here are real entry points of fake distributions (see conftest.FakePlugins).
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from kvtiers.contract import CONTRACT_VERSION
from kvtiers.errors import PluginError, UnknownNameError
from kvtiers.plugins import Registry, TierRecord
from kvtiers.plugins.registry import CORE_DISTRIBUTION, ENV_ALLOW, ENV_DISABLE

from .conftest import FakePlugins, tier_module

RAISES_ON_IMPORT = "import kvtiers_no_such_dependency  # noqa: F401\n"


def plugin_tiers(registry: Registry) -> set[str]:
    """Tier names registered by plugins (not by the core's built-ins)."""
    return {n for n, r in registry.tiers.items() if r.distribution != CORE_DISTRIBUTION}


def rows_for(registry: Registry, name: str) -> list[dict[str, Any]]:
    return [r for r in registry.listing() if r["name"] == name]


def test_builtins_load_without_any_plugin(fake_plugins: FakePlugins) -> None:
    reg = fake_plugins.load()
    assert not reg.failures and not reg.conflicts
    assert reg.get_policy("lru").distribution == CORE_DISTRIBUTION
    assert "plugins" in reg.commands


def test_import_error_is_recorded_and_the_other_plugins_still_load(
    fake_plugins: FakePlugins,
) -> None:
    fake_plugins.add("kvtiers-bad", {"bad": RAISES_ON_IMPORT}, version="0.3")
    fake_plugins.add("kvtiers-angry", {"angry": "raise RuntimeError('no licence key')\n"})
    fake_plugins.add("kvtiers-good", {"good": tier_module("good")})
    reg = fake_plugins.load()

    assert reg.get_tier("good").distribution == "kvtiers-good"
    assert reg.get_policy("lru").distribution == CORE_DISTRIBUTION
    failures = {f.plugin: f for f in reg.failures}
    assert set(failures) == {"bad", "angry"}
    bad = failures["bad"]
    assert (bad.distribution, bad.version) == ("kvtiers-bad", "0.3")
    assert "ModuleNotFoundError" in bad.reason and "kvtiers_no_such_dependency" in bad.reason
    assert failures["angry"].reason == "RuntimeError: no licence key"
    [row] = rows_for(reg, "bad")
    assert row["status"] == "error" and row["kind"] == "plugin"
    assert row["distribution"] == "kvtiers-bad" and "kvtiers_no_such_dependency" in row["error"]


def test_exception_inside_a_hook_is_recorded_and_other_hooks_still_run(
    fake_plugins: FakePlugins,
) -> None:
    source = textwrap.dedent(
        f"""
        from kvtiers.plugins import PolicyRecord, hookimpl

        @hookimpl
        def kvtiers_register_tiers():
            raise KeyError("cache_dir")

        @hookimpl
        def kvtiers_register_policies():
            return [PolicyRecord("clock", "x:Clock", "second chance", {CONTRACT_VERSION})]
        """
    )
    fake_plugins.add("kvtiers-flaky", {"flaky": source})
    fake_plugins.add("kvtiers-good", {"good": tier_module("good")})
    reg = fake_plugins.load()

    [failure] = reg.failures
    assert failure.distribution == "kvtiers-flaky"
    assert failure.reason == "kvtiers_register_tiers raised KeyError: 'cache_dir'"
    assert reg.get_policy("clock").distribution == "kvtiers-flaky"
    assert reg.get_tier("good").distribution == "kvtiers-good"


def test_a_record_that_is_not_a_record_is_recorded(fake_plugins: FakePlugins) -> None:
    source = textwrap.dedent(
        """
        from kvtiers.plugins import hookimpl

        @hookimpl
        def kvtiers_register_tiers():
            return [{"name": "dicty"}]
        """
    )
    fake_plugins.add("kvtiers-dicty", {"dicty": source})
    [failure] = fake_plugins.load().failures
    assert "returned dict where a TierRecord was expected" in failure.reason


def test_wrong_contract_version_is_recorded_and_selecting_it_names_it(
    fake_plugins: FakePlugins,
) -> None:
    future = CONTRACT_VERSION + 1
    # One module, two records: only the record for another version is refused.
    source = textwrap.dedent(
        f"""
        from kvtiers.plugins import TierRecord, hookimpl

        @hookimpl
        def kvtiers_register_tiers():
            return [
                TierRecord("hologram", "x:Y", {{}}, "from the future", {future}),
                TierRecord("current", "x:Y", {{}}, "for today", {CONTRACT_VERSION}),
            ]
        """
    )
    fake_plugins.add("kvtiers-hologram", {"hologram": source}, version="9.0")
    reg = fake_plugins.load()

    assert reg.get_tier("current").distribution == "kvtiers-hologram"
    [failure] = reg.failures
    assert (failure.kind, failure.name) == ("tier", "hologram")
    with pytest.raises(PluginError) as info:
        reg.get_tier("hologram")
    assert not isinstance(info.value, UnknownNameError)
    message = str(info.value)
    assert "'hologram'" in message and "kvtiers-hologram" in message
    assert f"contract version {future}" in message and f"version {CONTRACT_VERSION}" in message
    [row] = rows_for(reg, "hologram")
    assert (row["kind"], row["status"]) == ("tier", "error")


def test_two_distributions_registering_one_name_break_that_name_only(
    fake_plugins: FakePlugins,
) -> None:
    fake_plugins.add("kvtiers-alpha", {"alpha": tier_module("nvme", "alpha-only")})
    fake_plugins.add("kvtiers-beta", {"beta": tier_module("nvme", "beta-only")})
    reg = fake_plugins.load()

    assert reg.get_tier("alpha-only").distribution == "kvtiers-alpha"
    assert reg.get_tier("beta-only").distribution == "kvtiers-beta"
    assert "nvme" not in reg.tiers
    with pytest.raises(PluginError) as info:
        reg.get_tier("nvme")
    message = str(info.value)
    assert "'nvme'" in message and "kvtiers-alpha" in message and "kvtiers-beta" in message
    assert ENV_DISABLE in message  # says how to get out of it
    rows = rows_for(reg, "nvme")
    assert {r["distribution"] for r in rows} == {"kvtiers-alpha", "kvtiers-beta"}
    assert all(r["status"] == "error" and "kvtiers-beta" in r["error"] for r in rows)


def test_a_plugin_cannot_take_a_built_in_name(fake_plugins: FakePlugins) -> None:
    fake_plugins.add("kvtiers-squatter", {"squat": tier_module("memory", "squat-ok")})
    reg = fake_plugins.load()
    assert reg.get_tier("memory").distribution == "kvtiers-core"  # still usable
    assert reg.get_tier("squat-ok").distribution == "kvtiers-squatter"
    assert not reg.conflicts
    [failure] = [f for f in reg.failures if f.name == "memory"]
    assert failure.distribution == "kvtiers-squatter" and "built-in" in failure.reason
    rows = rows_for(reg, "memory")
    assert {(r["distribution"], r["status"]) for r in rows} == {
        ("kvtiers-core", "ok"), ("kvtiers-squatter", "error")}


def test_three_claims_name_all_three(fake_plugins: FakePlugins) -> None:
    for dist in ("kvtiers-a", "kvtiers-b", "kvtiers-c"):
        fake_plugins.add(dist, {dist[-1]: tier_module("same")})
    with pytest.raises(PluginError) as info:
        fake_plugins.load().get_tier("same")
    assert all(d in str(info.value) for d in ("kvtiers-a", "kvtiers-b", "kvtiers-c"))


def test_disabling_one_claimant_resolves_the_conflict(fake_plugins: FakePlugins) -> None:
    fake_plugins.add("kvtiers-alpha", {"alpha": tier_module("nvme")})
    fake_plugins.add("kvtiers-beta", {"beta": tier_module("nvme")})
    reg = fake_plugins.load({ENV_DISABLE: "kvtiers-beta"})
    assert reg.get_tier("nvme").distribution == "kvtiers-alpha"
    assert not reg.conflicts


def test_disable_by_entry_point_or_distribution_name(fake_plugins: FakePlugins) -> None:
    fake_plugins.add("kvtiers-one", {"one": tier_module("one")})
    fake_plugins.add("kvtiers-two", {"two": tier_module("two")})
    fake_plugins.add("kvtiers-bad", {"bad": RAISES_ON_IMPORT})

    reg = fake_plugins.load({ENV_DISABLE: " one , kvtiers-bad,,"})
    assert plugin_tiers(reg) == {"two"}
    assert not reg.failures  # a disabled plugin is not even imported
    # The core's built-ins cannot be disabled: everything else depends on them.
    reg = fake_plugins.load({ENV_DISABLE: f"{CORE_DISTRIBUTION},builtin"})
    assert "lru" in reg.policies and plugin_tiers(reg) == {"one", "two"}


def test_allow_loads_only_the_named_plugins(fake_plugins: FakePlugins) -> None:
    fake_plugins.add("kvtiers-one", {"one": tier_module("one")})
    fake_plugins.add("kvtiers-two", {"two": tier_module("two")})
    fake_plugins.add("kvtiers-bad", {"bad": RAISES_ON_IMPORT})

    reg = fake_plugins.load({ENV_ALLOW: "kvtiers-two"})
    assert plugin_tiers(reg) == {"two"} and not reg.failures
    assert "lru" in reg.policies  # built-ins load regardless
    reg = fake_plugins.load({ENV_ALLOW: "one,two", ENV_DISABLE: "two"})
    assert plugin_tiers(reg) == {"one"}


def test_unknown_name_suggests_and_lists_installed(fake_plugins: FakePlugins) -> None:
    fake_plugins.add("kvtiers-sqlite", {"sqlite": tier_module("sqlite")})
    fake_plugins.add("kvtiers-nvme", {"nvme": tier_module("nvme")})
    fake_plugins.add("kvtiers-bad", {"bad": RAISES_ON_IMPORT})
    reg = fake_plugins.load()

    with pytest.raises(UnknownNameError) as info:
        reg.get_tier("sqlit")
    message = str(info.value)
    assert isinstance(info.value, LookupError)
    assert "unknown tier 'sqlit'" in message and "did you mean 'sqlite'?" in message
    installed = message.split("installed tiers: ", 1)[1].split(";")[0].split(", ")
    assert {"nvme", "sqlite"} <= set(installed) and installed == sorted(installed)
    assert "failed to load: bad" in message  # the name may have been meant for it

    with pytest.raises(UnknownNameError, match="did you mean 'lru'"):
        reg.get_policy("lur")
    # a name in another case is still meant: "LRU" is "lru", "SIEV" is "sieve"
    for typed, meant in (("LRU", "lru"), ("Arc", "arc"), ("SIEV", "sieve")):
        with pytest.raises(UnknownNameError, match=f"did you mean '{meant}'"):
            reg.get_policy(typed)
    with pytest.raises(UnknownNameError) as info:
        reg.get_tier("zzzzzz")
    assert "did you mean" not in str(info.value)


def test_unknown_shipped_tier_names_the_distribution_to_install(
    fake_plugins: FakePlugins,
) -> None:
    reg = fake_plugins.load({ENV_ALLOW: ""})
    if "s3" in reg.tiers:  # pragma: no cover - only if the core ever ships it
        pytest.skip("s3 is built in")
    with pytest.raises(UnknownNameError, match="install kvtiers-s3 to use type 's3'"):
        reg.get_tier("s3")


def test_records_are_lazy_a_bad_class_path_breaks_only_on_use(
    fake_plugins: FakePlugins,
) -> None:
    fake_plugins.add("kvtiers-lazy", {"lazy": tier_module("lazy")})
    reg = fake_plugins.load()
    record: TierRecord = reg.get_tier("lazy").record
    assert not reg.failures  # nothing imported the class yet
    with pytest.raises(PluginError, match="cannot import 'kvtiers_fake_tiers'"):
        record.load()
