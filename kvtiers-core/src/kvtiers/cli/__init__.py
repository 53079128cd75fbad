"""The `kvtiers` command. Sub-commands come from the plugin registry (the core's
own ones too). Expected failures print one clear message per problem and exit 2;
no traceback reaches the user unless KVTIERS_DEBUG is set."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from kvtiers.errors import ConfigError, KvtiersError

EXIT_USAGE = 2


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
