"""The hooks a kvtiers plugin implements. A plugin is a module named by an entry
point in group `kvtiers`; it implements any of these hooks with `@hookimpl` and
returns records. Keep plugin modules thin: import tier code lazily (records name
classes as "module:Class" strings) so `kvtiers plugins` starts fast."""

from __future__ import annotations

import pluggy

from kvtiers.plugins.records import (
    AdmissionRecord,
    CommandRecord,
    PolicyRecord,
    TierRecord,
    VllmSpecRecord,
    VllmTierRecord,
)

PROJECT = "kvtiers"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def kvtiers_register_tiers() -> list[TierRecord]:  # type: ignore[empty-body]
    """Secondary tiers this plugin provides."""


@hookspec
def kvtiers_register_policies() -> list[PolicyRecord]:  # type: ignore[empty-body]
    """Eviction policies this plugin provides."""


@hookspec
def kvtiers_register_admissions() -> list[AdmissionRecord]:  # type: ignore[empty-body]
    """Admission policies (which blocks cascade to a tier) this plugin provides."""


@hookspec
def kvtiers_register_commands() -> list[CommandRecord]:  # type: ignore[empty-body]
    """`kvtiers` sub-commands this plugin provides."""


@hookspec
def kvtiers_register_vllm_specs() -> list[VllmSpecRecord]:  # type: ignore[empty-body]
    """vLLM offloading specs whose extra config is a kvtiers config, with the keys
    each reads itself (`kvtiers validate` reads vLLM configs that name them)."""


@hookspec
def kvtiers_register_vllm_tiers() -> list[VllmTierRecord]:  # type: ignore[empty-body]
    """Entry forms of vLLM's `secondary_tiers` that wrap a kvtiers tier section."""
