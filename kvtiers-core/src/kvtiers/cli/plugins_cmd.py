"""`kvtiers plugins`: what is installed, where it came from, and what failed.

Exit status: 0 when everything loaded, 1 when a plugin failed to load, a name is
registered twice, or a config schema is not valid (`--check` prints only those,
for CI). `--options NAME` lists one tier's, policy's or admission policy's options
(the configuration reference covers the built-ins only).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any

from kvtiers.plugins.registry import Registered, Registry

EXIT_BROKEN = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List installed tiers, policies and commands, and plugins that failed to load. "
        "Exit status: 0 all usable, 1 something failed (a plugin did not load, a name is "
        "registered twice, a config schema is not valid JSON Schema)."
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list of objects")
    parser.add_argument(
        "--check",
        action="store_true",
        help="print only what failed, one line each (nothing else when all is well), "
        "for CI; the exit status says the same",
    )
    parser.add_argument(
        "--options",
        metavar="NAME",
        help="show the options of the installed tier, policy or admission policy NAME: key, "
        "type, default, description (with --json: its JSON Schema)",
    )


# The kinds whose records carry an options schema, in the order `--options NAME`
# looks a name up (a name may be both a tier and a policy: the tier wins).
_WITH_OPTIONS: dict[str, Callable[[Registry], Mapping[str, Registered[Any]]]] = {
    "tier": lambda r: r.tiers,
    "policy": lambda r: r.policies,
    "admission": lambda r: r.admissions,
}


def rows(registry: Registry) -> list[dict[str, Any]]:
    """The registry's listing, each tier's and policy's schema checked too (a row
    whose schema is broken turns into an error)."""
    from kvtiers.config.schema_check import schema_problem

    out = registry.listing()
    for row in out:
        if row["status"] != "ok" or row["kind"] not in _WITH_OPTIONS:
            continue
        reg = _WITH_OPTIONS[row["kind"]](registry).get(row["name"])
        problem = schema_problem(reg.record.schema) if reg is not None else None
        if problem:
            row["status"] = "error"
            row["error"] = f"its config schema is unusable (a bug in the plugin): {problem}"
    return out


def run(args: argparse.Namespace) -> int:
    from kvtiers.plugins import get_registry

    registry = get_registry()
    if args.options:
        return _options(registry, args.options, args.json)
    listing = rows(registry)
    broken = [r for r in listing if r["status"] == "error"]
    status = EXIT_BROKEN if broken else 0
    if args.check:
        for r in broken:
            print(f"error: {r['kind']} {r['name']!r} ({r['distribution']} {r['version']}): "
                  f"{r['error']}")
        return status
    if args.json:
        print(json.dumps(listing, indent=2))
        return status
    from rich.console import Console

    console = Console()
    if console.width >= WIDE:
        console.print(_table(listing))
    else:
        console.print(_stacked(listing, console.width), highlight=False)
    return status


#: from this many columns on, the listing is one table; narrower, each entry's
#: description goes under its line (names and versions are never cut)
WIDE = 110


def _table(listing: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="kvtiers plugins", show_lines=False)
    for col in ("name", "kind", "distribution", "version", "status"):
        table.add_column(col, no_wrap=True)
    table.add_column("description / error", overflow="fold")
    for r in listing:
        table.add_row(r["name"], r["kind"], r["distribution"], r["version"], _mark(r),
                      _detail(r))
    return table


def _stacked(listing: list[dict[str, Any]], width: int) -> str:
    """The listing for a narrow terminal: a line per entry (name, kind, where from,
    status), its description wrapped below it, indented."""
    import textwrap

    from rich.markup import escape

    name_w = max(len(r["name"]) for r in listing) if listing else 0
    kind_w = max(len(r["kind"]) for r in listing) if listing else 0
    lines = [f"[bold]kvtiers plugins[/] ({len(listing)})"]
    for r in listing:
        origin = f"{r['distribution']} {r['version']}"
        head = f"{r['name']:<{name_w}}  {r['kind']:<{kind_w}}  {origin}  {r['status']}"
        detail = _detail(r)
        if len(head) <= width:
            lines.append(f"{escape(r['name']):<{name_w}}  {r['kind']:<{kind_w}}  "
                         f"{escape(origin)}  {_mark(r)}")
        else:  # where it comes from starts the text below
            lines.append(f"{escape(r['name'])}  {r['kind']}  {_mark(r)}")
            detail = f"{origin}: {detail}"
        wrapped = textwrap.wrap(detail, width=max(20, width - 5))
        lines += [f"    {escape(line)}" for line in wrapped]
    return "\n".join(lines)


def _mark(row: dict[str, Any]) -> str:
    return "[green]ok[/]" if row["status"] == "ok" else "[red]error[/]"


def _detail(row: dict[str, Any]) -> str:
    text = row["error"] if row["status"] == "error" else row["description"]
    return str(text or "")


def _options(registry: Registry, name: str, as_json: bool) -> int:
    from kvtiers.errors import UnknownNameError
    from kvtiers.plugins.registry import unknown_name_message

    found = [(kind, table(registry)[name]) for kind, table in _WITH_OPTIONS.items()
             if name in table(registry)]
    if not found:
        # One message for every table: a NAME is looked up as a tier first.
        every: dict[str, Registered[Any]] = {}
        for table in reversed(_WITH_OPTIONS.values()):
            every.update(table(registry))
        raise UnknownNameError(
            unknown_name_message("tier", name, every, registry.failures).replace(
                "installed tiers", "installed tiers, policies and admission policies", 1
            )
        )
    kind, reg = found[0]
    schema = reg.record.schema
    if as_json:
        print(json.dumps(schema, indent=2, default=str))
        return 0
    import textwrap

    from kvtiers.config.docs import option_rows

    about = getattr(reg.record, "description", "") or getattr(reg.record, "help", "")
    kind = "admission policy" if kind == "admission" else kind
    print(f"{kind} {name!r} from {reg.distribution} {reg.version}: {about}")
    options = option_rows(schema)
    if not options:
        print("no options")
    for key, type_text, default, description in options:
        plain = default.replace("`", "")
        when = {"required": "required", "none": "no default"}.get(plain, f"default {plain}")
        print(f"\n{key}: {type_text.replace('`', '')}; {when}")
        text = " ".join(description.split())
        if text:
            print(textwrap.fill(text, width=88, initial_indent="    ", subsequent_indent="    "))
    return 0
