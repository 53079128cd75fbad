"""The core's own registrations, made through the same hooks as any plugin."""

from __future__ import annotations

from kvtiers.plugins.hookspecs import hookimpl
from kvtiers.plugins.records import CommandRecord, PolicyRecord, TierRecord
from kvtiers.tier import CONTRACT_VERSION


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    from kvtiers.tiers.schemas import FAULTY_SCHEMA, MEMORY_SCHEMA

    return [
        TierRecord(
            "memory",
            "kvtiers.tiers.memory:MemoryTier",
            MEMORY_SCHEMA,
            "blocks in this process's RAM: bounded, evicted by policy, checksummed",
            CONTRACT_VERSION,
        ),
        TierRecord(
            "faulty",
            "kvtiers.tiers.faulty:FaultyTier",
            FAULTY_SCHEMA,
            "wraps any tier and injects errors, misses, latency, hangs and corruption (tests)",
            CONTRACT_VERSION,
        ),
    ]


@hookimpl
def kvtiers_register_policies() -> list[PolicyRecord]:
    return [
        PolicyRecord(
            "lru",
            "kvtiers.policies.lru:LRUPolicy",
            "least recently used; pinned entries are never walked",
            CONTRACT_VERSION,
        ),
        PolicyRecord(
            "arc",
            "kvtiers.policies.arc:ARCPolicy",
            "adaptive replacement cache: balances recency and frequency, ghost lists"
            " bounded by capacity",
            CONTRACT_VERSION,
        ),
        PolicyRecord(
            "sieve",
            "kvtiers.policies.sieve:SievePolicy",
            "SIEVE: FIFO with visited bits; scan-resistant, a hit only sets a bit, no ghosts",
            CONTRACT_VERSION,
        ),
    ]


@hookimpl
def kvtiers_register_commands() -> list[CommandRecord]:
    from kvtiers.cli import bench_cmd, plugins_cmd, validate_cmd

    return [
        CommandRecord(
            "plugins",
            "list installed tiers, policies and commands, and plugins that failed to load",
            plugins_cmd.add_arguments,
            plugins_cmd.run,
            CONTRACT_VERSION,
        ),
        CommandRecord(
            "validate",
            "check a config (kvtiers or vLLM kv_transfer_config) and summarise the stack",
            validate_cmd.add_arguments,
            validate_cmd.run,
            CONTRACT_VERSION,
        ),
        CommandRecord(
            "bench",
            "replay a chat workload through the real stack, moving and verifying real bytes",
            bench_cmd.add_arguments,
            bench_cmd.run,
            CONTRACT_VERSION,
        ),
    ]
