"""The `kvtiers` command. Sub-commands come from the plugin registry (the core's
own ones too). Expected failures print one clear message per problem and exit 2;
no traceback reaches the user unless KVTIERS_DEBUG is set."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Protocol

from kvtiers.errors import ConfigError, KvtiersError, PluginError

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13  # as if killed by SIGPIPE, what `yes | head` reports


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv` (default: `sys.argv[1:]`). Every registered command gets
    a sub-parser with its help line, but only the command `argv` names gets its
    arguments: resolving a command's record imports its module, and listing
    commands (`kvtiers --help`) or running one must not import the others."""
    from kvtiers import __version__
    from kvtiers.plugins import get_registry

    commands = get_registry().commands
    chosen = _command_in(sys.argv[1:] if argv is None else argv, commands)
    parser = argparse.ArgumentParser(
        prog="kvtiers",
        description="Move the KV cache of LLM inference engines across storage tiers.",
    )
    parser.add_argument("--version", action="version", version=f"kvtiers {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, reg in sorted(commands.items()):
        rec = reg.record
        p = sub.add_parser(name, help=rec.help, description=rec.help)
        if name == chosen:
            rec.load_add_arguments()(p)
            p.set_defaults(_record=rec)
    return parser


def _command_in(argv: Sequence[str], commands: Mapping[str, object]) -> str | None:
    """The sub-command `argv` runs: its first word that is not an option (the top
    level takes no option with a value)."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in commands else None
    return None



class _Main(Protocol):
    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def _closed_stdout_is_quiet(run: _Main) -> _Main:
    """`kvtiers ... | head -2`: when the reader of stdout leaves, stop quietly with
    SIGPIPE's status instead of a BrokenPipeError traceback, for every command."""

    @functools.wraps(run)
    def quiet(argv: Sequence[str] | None = None) -> int:
        try:
            status = run(argv)
            sys.stdout.flush()  # a reader that left shows here, not at exit
            return status
        except BrokenPipeError:
            # Python flushes stdout once more at exit; pointed at /dev/null, quietly.
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE

    return quiet


@_closed_stdout_is_quiet
def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser(argv)
    except PluginError as exc:  # the chosen command's module cannot be loaded
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    record = getattr(args, "_record", None)
    if record is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(record.load_run()(args) or 0)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except KvtiersError as exc:
        if os.environ.get("KVTIERS_DEBUG"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

