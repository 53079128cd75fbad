"""`kvtiers snapshot save CONFIG URL [--tier NAME] [--hottest N] [--overwrite]` and
`kvtiers snapshot load CONFIG URL [--tier NAME]`: a persistent tier's blocks to and
from a zarr v3 store on any fsspec URL (`kvtiers.ops.snapshot_store`), to pre-warm
a new deployment with a known cache (a system prompt's, say).

save: the namespace of the config's `model` (or the only one in the store), hottest
blocks first (the tier's order of use where it gives one, else newest). load: every
block verified against its checksum, stored coldest first (the hottest end up the
most recently used); a snapshot of another model than the config's is refused,
naming both. Exit 0; 1 when blocks failed (bad bytes in the snapshot, a tier that
refused them); 2 config or usage errors (printed by `kvtiers.cli.main`). Needs
zarr: `kvtiers-core[snapshot]`.

save never deletes or overwrites what kvtiers did not write: URL must be absent,
an empty directory, or - with `--overwrite` - a kvtiers snapshot; a path that holds
anything else (a file, a link, a directory of other files, a snapshot with files
kvtiers did not write) is refused before any work, exit 2, `--overwrite` or not,
naming the path and what it holds. The new snapshot is written whole (and synced)
in a staging directory and put in place only then, so a failure or a kill leaves
an old snapshot as it was (`kvtiers.ops.snapshot_target`). A `file://` URL is the
same as the plain path; `~` is the home directory.

Remote stores take fsspec's storage options: `--storage-option KEY=VALUE`
(repeatable; VALUE read as JSON when it parses, else a string), or, for
credentials, the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_ENDPOINT_URL`, or fsspec's `FSSPEC_S3_KEY`, `FSSPEC_S3_ENDPOINT_URL`, ...).
Options are never printed, and errors blank their values.

The CPU pool lives in the engine's process, so this command cannot reach one:
`--tier cpu` says so and where it is done instead (`kvtiers bench` and `kvtiers
serve --snapshot-save/--snapshot-load`, `kvtiers.ops.pool_snapshot` in an engine). Its
snapshots have this format: `load` puts one into a persistent tier.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvtiers.errors import KvtiersError
from kvtiers.ops.storage_options import parse_storage_options

#: the name `--tier` gives the CPU pool (as in `kvtiers` events and stats)
POOL_TIER = "cpu"


def add_storage_option(parser: Any) -> None:
    """`--storage-option KEY=VALUE` (repeatable) on `parser` (or an argument group)."""
    parser.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="an fsspec storage option of the snapshot's URL (repeatable; VALUE as JSON "
        "when it parses, else a string), e.g. endpoint_url=http://127.0.0.1:9000; "
        "credentials better from the environment (AWS_ACCESS_KEY_ID, ...)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, what in (("save", "a tier's blocks, newest first, into a new snapshot"),
                         ("load", "a snapshot's blocks, each verified, into a tier")):
        p = sub.add_parser(action, help=what, description=what)
        p.add_argument("config", metavar="CONFIG", help="a kvtiers config (file or JSON)")
        p.add_argument("url", metavar="URL",
                       help="the snapshot: a directory (a path, ~/..., file://...) or an "
                       "fsspec URL (s3://, memory://)" + (
                           "; save: absent, an empty directory, or a kvtiers snapshot with "
                           "--overwrite - anything else is refused, never deleted"
                           if action == "save" else ""))
        p.add_argument("--tier", metavar="NAME",
                       help="the persistent tier (default: the first); `cpu` for the CPU "
                       "pool explains where its snapshots are taken")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        add_storage_option(p)
        if action == "save":
            p.add_argument("--hottest", type=int, metavar="N",
                           help="only the N hottest blocks (most recently used where the "
                           "tier knows, else newest)")
            p.add_argument("--overwrite", action="store_true",
                           help="replace a kvtiers snapshot already at URL, once the new "
                           "one is complete (a failed or killed save leaves the old one); "
                           "a path holding anything else is refused with or without it")


def run(args: argparse.Namespace) -> int:
    from kvtiers.config import load_config
    from kvtiers.ops.snapshot_store import SnapshotError, describe_error, require_zarr
    from kvtiers.ops.targets import persistent_tiers

    if args.tier == POOL_TIER:
        raise KvtiersError(_POOL_MESSAGE.format(action=args.action))
    options = parse_storage_options(args.storage_option)
    config = load_config(args.config, check_machine=False)
    target = persistent_tiers(config, args.tier, command=f"snapshot {args.action}")[0]
    require_zarr()
    try:
        return _run(args, config, target, options)
    except KvtiersError:
        raise
    except Exception as exc:  # the store's I/O mid-way: fsspec's and botocore's errors
        raise SnapshotError(f"kvtiers snapshot {args.action} {args.url}: "
                            f"{describe_error(exc, options)}") from exc


_POOL_MESSAGE = (
    "kvtiers snapshot {action} --tier cpu: the CPU pool and which block each slot holds "
    "live in the engine's process, out of this command's reach; {action} a pool from "
    "there: `kvtiers bench --snapshot-{action} URL` around a bench run, `kvtiers serve "
    "--snapshot-{action} URL` for a cache node (kvtiers-p2p), or "
    "kvtiers.ops.pool_snapshot.{action}_pool(manager, pool, namespace, ...) in an "
    "engine. A pool's snapshot has this command's format: `kvtiers snapshot load "
    "CONFIG URL` stores one into a persistent tier")


def _run(args: argparse.Namespace, config: Any, target: Any,
         options: dict[str, Any] | None) -> int:
    from kvtiers.ops.snapshot import BATCH, load_tier, save_tier
    from kvtiers.ops.snapshot_store import SnapshotReader
    from kvtiers.ops.targets import namespace_of, open_namespace, survey

    if args.action == "save":
        if args.hottest is not None and args.hottest < 1:
            raise KvtiersError("--hottest must be at least 1")
        from kvtiers.ops.snapshot_target import check_target

        # before any work; checked again by the writer, just before the swap
        check_target(args.url, options, overwrite=args.overwrite, flag="--overwrite")
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
            result = save_tier(tier, args.url, hottest=args.hottest, storage_options=options,
                               overwrite=args.overwrite)
    else:
        reader = SnapshotReader(args.url, storage_options=options)
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
        by = {"recency": "most recently used first", "stored_at": "newest first"}.get(
            result.hottest_by, "")
        print(f"{verb} {result.blocks} blocks of {namespace} "
              f"({'to' if args.action == 'save' else 'from'} {args.url}"
              + (f"; {by}" if by else "") + ")")
        for reason, n in sorted(result.failed.items()):
            print(f"  failed: {n} {reason}")
        if result.bad:
            print(f"  {len(result.bad)} block(s) in the snapshot fail their checksum: skipped")
    return 1 if result.failed or result.bad else 0
