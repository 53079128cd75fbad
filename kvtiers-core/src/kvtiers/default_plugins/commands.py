"""The built-in `kvtiers` sub-commands: `plugins`, `validate`, `bench`, `inspect`,
`verify` and `snapshot`. Named lazily: the CLI imports a command's module only to
run that command."""

from __future__ import annotations

from kvtiers.plugins.hookspecs import hookimpl
from kvtiers.plugins.records import CommandRecord
from kvtiers.plugins.version import CONTRACT_VERSION

_COMMANDS = (
    ("plugins", "list installed tiers, policies and commands, and plugins that failed to load"),
    ("validate", "check a config (kvtiers or vLLM kv_transfer_config) and summarise the stack"),
    ("bench", "replay a chat workload through the real stack, moving and verifying real bytes"),
    ("inspect", "what each persistent tier holds: namespaces, blocks, usage, ages (read-only)"),
    ("verify", "re-read and re-checksum every block of the persistent tiers; --repair"),
    ("snapshot", "save a persistent tier's blocks to a zarr store, or load them (pre-warm)"),
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
