"""The core's own registrations, made through the same hooks as any plugin."""

from __future__ import annotations

from kvtiers.plugins.hookspecs import hookimpl
from kvtiers.plugins.records import CommandRecord, PolicyRecord, TierRecord
from kvtiers.tier import CONTRACT_VERSION


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    return []


@hookimpl
def kvtiers_register_policies() -> list[PolicyRecord]:
    return [
        PolicyRecord(
            "lru",
            "kvtiers.policies.lru:LRUPolicy",
            "least recently used; pinned entries are never walked",
            CONTRACT_VERSION,
        ),
    ]


@hookimpl
def kvtiers_register_commands() -> list[CommandRecord]:
    from kvtiers.cli import plugins_cmd

    return [
        CommandRecord(
            "plugins",
            "list installed tiers, policies and commands, and plugins that failed to load",
            plugins_cmd.add_arguments,
            plugins_cmd.run,
            CONTRACT_VERSION,
        ),
    ]
