"""`kvtiers snapshot save CONFIG URL [--tier NAME] [--hottest N]` and
`kvtiers snapshot load CONFIG URL [--tier NAME]`: a persistent tier's blocks to and
from a zarr v3 store on any fsspec URL (`kvtiers.ops.snapshot_store`), to pre-warm
a new deployment with a known cache (a system prompt's, say).

save: the namespace of the config's `model` (or the only one in the store), newest
blocks first. load: every block verified against its checksum; a snapshot of
another model than the config's is refused, naming both. Exit 0; 1 when blocks
failed (bad bytes in the snapshot, a tier that refused them); 2 config or usage
errors (printed by `kvtiers.cli.main`). Needs zarr: `kvtiers-core[snapshot]`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvtiers.errors import KvtiersError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, what in (("save", "a tier's blocks, newest first, into a new snapshot"),
                         ("load", "a snapshot's blocks, each verified, into a tier")):
        p = sub.add_parser(action, help=what, description=what)
        p.add_argument("config", metavar="CONFIG", help="a kvtiers config (file or JSON)")
        p.add_argument("url", metavar="URL",
                       help="the snapshot: a directory or an fsspec URL (s3://, memory://)")
        p.add_argument("--tier", metavar="NAME", help="the persistent tier (default: the first)")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        if action == "save":
            p.add_argument("--hottest", type=int, metavar="N",
                           help="only the N newest blocks")


def run(args: argparse.Namespace) -> int:
    from kvtiers.config import load_config
    from kvtiers.ops.snapshot import BATCH, load_tier, save_tier
    from kvtiers.ops.snapshot_store import SnapshotReader
    from kvtiers.ops.targets import namespace_of, open_namespace, persistent_tiers, survey

    config = load_config(args.config, check_machine=False)
    target = persistent_tiers(config, args.tier, command=f"snapshot {args.action}")[0]
    if args.action == "save":
        if args.hottest is not None and args.hottest < 1:
            raise KvtiersError("--hottest must be at least 1")
        candidates = [ns for ns in survey(target, ages=False)
                      if config.model is None or ns.model == config.model]
        fps = sorted({ns.namespace for ns in candidates})
        if len(fps) != 1:
            raise KvtiersError(
                f"kvtiers snapshot save: {len(fps)} namespaces of "
                f"{'model ' + repr(config.model) if config.model else 'any model'} in tier "
                f"{target.name}" + (f" ({', '.join(fps)})" if fps else "")
                + "; set the config's `model` to choose one")
        namespace = namespace_of(next(ns for ns in candidates if ns.namespace == fps[0]))
        if namespace is None:
            raise KvtiersError(f"namespace {fps[0]}: its description is unreadable")
        with open_namespace(target, namespace, slots=BATCH) as tier:
            result = save_tier(tier, args.url, hottest=args.hottest)
    else:
        reader = SnapshotReader(args.url)
        namespace = reader.namespace
        if config.model is not None and config.model != namespace.model:
            raise KvtiersError(
                f"the snapshot holds namespace {namespace} (model {namespace.model!r}); the "
                f"config's model is {config.model!r}: refusing to load another model's KV")
        with open_namespace(target, namespace, slots=BATCH) as tier:
            result = load_tier(tier, reader)
    doc: dict[str, Any] = {"action": args.action, "url": args.url, "tier": target.name,
                           "namespace": namespace.fingerprint, "model": namespace.model,
                           **result.as_dict()}
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        verb = "saved" if args.action == "save" else "loaded"
        print(f"{verb} {result.blocks} blocks of {namespace} "
              f"({'to' if args.action == 'save' else 'from'} {args.url})")
        for reason, n in sorted(result.failed.items()):
            print(f"  failed: {n} {reason}")
        if result.bad:
            print(f"  {len(result.bad)} block(s) in the snapshot fail their checksum: skipped")
    return 1 if result.failed or result.bad else 0
