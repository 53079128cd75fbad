"""`kvtiers inspect CONFIG [--tier NAME] [--json]`: what each persistent tier of a
config holds - every namespace in its store (ours: the config's `model`; others),
with its model and geometry, blocks and bytes, usage committed vs reserved vs
capacity, an age histogram and the oldest and newest blocks.

Read-only: the tiers are not built; each is read through `SecondaryTier.survey`,
which writes nothing and takes no lock engines wait for, so it runs while engines
use the tier. Exit 0; 2 for a config without a persistent tier (or an unknown
`--tier`), printed by `kvtiers.cli.main`. Imports no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from kvtiers.humanize import format_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG",
                        help="a kvtiers config (file or inline JSON; vLLM's "
                        "kv_transfer_config too)")
    parser.add_argument("--tier", metavar="NAME",
                        help="only this tier (its name in the stack: fs, fs#2, ...)")
    parser.add_argument("--json", action="store_true",
                        help="print everything as one JSON document")


def run(args: argparse.Namespace) -> int:
    from kvtiers.config import load_config
    from kvtiers.ops.summary import namespace_summary
    from kvtiers.ops.targets import is_ours, persistent_tiers, survey

    config = load_config(args.config, check_machine=False)
    targets = persistent_tiers(config, args.tier, command="inspect")
    now = time.time()
    doc: dict[str, Any] = {"config_model": config.model, "tiers": []}
    for t in targets:
        namespaces = survey(t, ages=True)
        doc["tiers"].append({
            "name": t.name, "type": t.section.type,
            "namespaces": [namespace_summary(ns, ours=is_ours(ns, config), now=now)
                           for ns in namespaces],
        })
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        _print(doc)
    return 0


def _age(seconds: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.1f}{unit}"
    return f"{seconds:.0f}s"


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from kvtiers.ops.summary import describe_geometry

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    for tier in doc["tiers"]:
        console.print(f"[bold]{tier['name']}[/bold] ({tier['type']}): "
                      f"{len(tier['namespaces'])} namespace(s)")
        if not tier["namespaces"]:
            console.print("  empty")
        for ns in tier["namespaces"]:
            who = f"{ns['model'] or '?'}@{ns['revision'] or '-'}"
            mark = "ours" if ns["ours"] else "other"
            fp = escape("[" + ns["namespace"][:12] + "]")
            console.print(f"  [bold]{escape(who)}[/bold] {fp} ({mark}) in "
                          f"{escape(ns['location'])}", soft_wrap=True)
            console.print(f"    geometry  {describe_geometry(ns['geometry'])}")
            cap = ns["capacity_bytes"]
            share = f" = {100 * ns['usage_bytes'] / cap:.1f}%" if cap else ""
            console.print(
                f"    blocks    {ns['blocks']:,} ({format_bytes(ns['committed_bytes'])} "
                f"committed) + {ns['reserved_blocks']:,} reserved "
                f"({format_bytes(ns['reserved_bytes'])}) of "
                f"{format_bytes(cap) if cap else 'unbounded'}{share}")
            if ns["unreadable_objects"]:
                console.print(
                    f"    [red]unreadable[/red] {ns['unreadable_objects']:,} object(s) "
                    f"({format_bytes(ns['unreadable_bytes'])}) hold no readable block: "
                    "counted in the usage; `kvtiers verify` says which")
            if ns["oldest"] is not None:
                console.print(f"    oldest    {_age(ns['oldest']['age_s'])} ago "
                              f"({ns['oldest']['key'][:16]}...), newest "
                              f"{_age(ns['newest']['age_s'])} ago")
                table = Table(box=None, padding=(0, 1), show_header=True)
                table.add_column("    age <=")
                for b in ns["age_histogram"]:
                    table.add_column(b["le"], justify="right")
                table.add_row("    blocks", *[f"{b['blocks']:,}" for b in ns["age_histogram"]])
                console.print(table)
            if ns["error"]:
                console.print(f"    [red]error[/red]     {escape(ns['error'])}")
