"""The built-in `kvtiers` sub-commands: `plugins`, `validate` and `bench`. Named
lazily: the CLI imports a command's module only to run that command."""

from __future__ import annotations

from kvtiers.contract import CONTRACT_VERSION
from kvtiers.plugins.hookspecs import hookimpl
from kvtiers.plugins.records import CommandRecord

_COMMANDS = (
    ("plugins", "list installed tiers, policies and commands, and plugins that failed to load"),
    ("validate", "check a config (kvtiers or vLLM kv_transfer_config) and summarise the stack"),
    ("bench", "replay a chat workload through the real stack, moving and verifying real bytes"),
)


@hookimpl
def kvtiers_register_commands() -> list[CommandRecord]:
    return [
        CommandRecord(
            name,
            help,
            f"kvtiers.cli.{name}_cmd:add_arguments",
            f"kvtiers.cli.{name}_cmd:run",
            CONTRACT_VERSION,
        )
        for name, help in _COMMANDS
    ]
