"""The `kvtiers` command. Sub-commands come from the plugin registry (the core's
own ones too). Expected failures print one clear message per problem and exit 2;
no traceback reaches the user unless KVTIERS_DEBUG is set."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Sequence

from kvtiers.errors import ConfigError, KvtiersError

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13  # as if killed by SIGPIPE, what `yes | head` reports


def build_parser() -> argparse.ArgumentParser:
    from kvtiers import __version__
    from kvtiers.plugins import get_registry

    parser = argparse.ArgumentParser(
        prog="kvtiers",
        description="Move the KV cache of LLM inference engines across storage tiers.",
    )
    parser.add_argument("--version", action="version", version=f"kvtiers {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, reg in sorted(get_registry().commands.items()):
        rec = reg.record
        p = sub.add_parser(name, help=rec.help, description=rec.help)
        rec.add_arguments(p)
        p.set_defaults(_run=rec.run)
    return parser


def _closed_stdout_is_quiet(
    run: Callable[[Sequence[str] | None], int],
) -> Callable[[Sequence[str] | None], int]:
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args._run(args) or 0)
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
