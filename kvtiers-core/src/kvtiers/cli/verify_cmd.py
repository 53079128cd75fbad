"""`kvtiers verify CONFIG [--tier NAME] [--repair] [--json]`: re-read and
re-checksum every block of each persistent tier of a config - every namespace in
its store - and report the bad ones by reason; `--repair` removes them through
the tier's own accounting (`SecondaryTier.verify_blocks`), so usage stays exact.

Beside live engines on a shared store: the tier is opened for each namespace as
any engine of that model opens it (it joins the store's protocol), and a block an
engine evicts while it is checked is not bad. A progress bar (rich) on stderr when
it is a terminal.

Exit 0: every block is good; 1: bad blocks were found (removed or not with
`--repair`), or a namespace could not be opened; 2: a config without a persistent
tier, or an unknown `--tier` (printed by `kvtiers.cli.main`). Imports no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvtiers.contract.verification import Progress, VerifyReport
from kvtiers.humanize import format_bytes

EXIT_BAD = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG",
                        help="a kvtiers config (file or inline JSON; vLLM's "
                        "kv_transfer_config too)")
    parser.add_argument("--tier", metavar="NAME",
                        help="only this tier (its name in the stack: fs, fs#2, ...)")
    parser.add_argument("--repair", action="store_true",
                        help="remove the bad blocks (through the tier's accounting)")
    parser.add_argument("--json", action="store_true",
                        help="print the reports as one JSON document")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from kvtiers.config import load_config
    from kvtiers.ops.targets import namespace_of, open_namespace, persistent_tiers, survey

    config = load_config(args.config, check_machine=False)
    targets = persistent_tiers(config, args.tier, command="verify")
    doc: dict[str, Any] = {"ok": True, "repair": args.repair, "tiers": []}
    show = not args.json and not args.no_progress and sys.stderr.isatty()
    for t in targets:
        entry: dict[str, Any] = {"name": t.name, "type": t.section.type, "namespaces": []}
        doc["tiers"].append(entry)
        for ns in survey(t, ages=False):
            namespace = namespace_of(ns)
            if namespace is None:
                doc["ok"] = False
                entry["namespaces"].append({
                    "namespace": ns.namespace, "location": ns.location, "model": ns.model,
                    "error": "cannot be opened: its description (model, geometry) is "
                    f"missing or not of this format version{': ' + ns.error if ns.error else ''}",
                })
                continue
            if any(n["namespace"] == ns.namespace for n in entry["namespaces"]):
                continue  # one per namespace: the tier verifies all its roots at once
            with open_namespace(t, namespace) as tier, _progress(
                    show, f"{t.name} {namespace}") as progress:
                try:
                    reports = tier.verify_blocks(repair=args.repair, progress=progress)
                except NotImplementedError as exc:
                    from kvtiers.errors import KvtiersError

                    raise KvtiersError(f"tier {t.name}: {exc}") from exc
            for r in reports:
                doc["ok"] &= r.ok
                entry["namespaces"].append(_report(r, ns.model))
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        _print(doc)
    return 0 if doc["ok"] else EXIT_BAD


def _report(r: VerifyReport, model: str | None) -> dict[str, Any]:
    return {
        "namespace": r.namespace, "model": model, "location": r.location,
        "checked": r.checked, "bad": [
            {"key": None if b.key is None else b.key.hex(), "reason": b.reason,
             "detail": b.detail, "location": b.location, "removed": b.removed}
            for b in r.bad],
        "by_reason": r.by_reason(), "vanished": r.vanished,
        "removed_bytes": r.removed_bytes, "notes": list(r.notes), "ok": r.ok,
    }


@contextmanager
def _progress(show: bool, label: str) -> Iterator[Progress | None]:
    if not show:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress("{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True),
                  transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _print(doc: dict[str, Any]) -> None:
    for tier in doc["tiers"]:
        print(f"{tier['name']} ({tier['type']}):")
        if not tier["namespaces"]:
            print("  no namespace: nothing to verify")
        for ns in tier["namespaces"]:
            who = f"{ns.get('model') or '?'} [{ns['namespace'][:12]}]"
            if ns.get("location"):
                who += f" in {ns['location']}"
            if "error" in ns:
                print(f"  {who}: {ns['error']}")
                continue
            state = "ok" if ns["ok"] else f"{len(ns['bad'])} bad"
            print(f"  {who}: {ns['checked']:,} blocks checked, {state}"
                  + (f", {ns['vanished']} evicted meanwhile" if ns["vanished"] else ""))
            for reason, n in sorted(ns["by_reason"].items()):
                print(f"    {reason}: {n}")
            for b in ns["bad"]:
                done = " (removed)" if b["removed"] else ""
                print(f"    {b['reason']:<11} {b['location']}: {b['detail']}{done}")
            if ns["removed_bytes"]:
                print(f"    removed {format_bytes(ns['removed_bytes'])}")
            for note in ns["notes"]:
                print(f"    note: {note}")
    print("verify: " + ("every block is good" if doc["ok"] else
                        "problems found" + (" (bad blocks removed)" if doc["repair"] else
                                            "; --repair removes bad blocks")))
