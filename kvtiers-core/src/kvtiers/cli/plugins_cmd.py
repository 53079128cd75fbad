"""`kvtiers plugins`: what is installed, where it came from, and what failed."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list of objects")


def run(args: argparse.Namespace) -> int:
    from kvtiers.plugins import get_registry

    rows = get_registry().listing()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="kvtiers plugins", show_lines=False)
    for col in ("name", "kind", "distribution", "version", "status", "description / error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        detail = r["error"] if r["status"] == "error" else r["description"]
        status = "[green]ok[/]" if r["status"] == "ok" else "[red]error[/]"
        table.add_row(r["name"], r["kind"], r["distribution"], r["version"], status, detail or "")
    Console().print(table)
    return 0
