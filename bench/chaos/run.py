"""Run the chaos scenarios and report, per scenario: wrong bytes served (must be 0),
blocks reported stored and later lost, the longest job (submit to result), the
longest single scheduler-side call (lookup, submit, collecting results), errors
by reason, the recovery time after a fault ends (where one applies) and the tier's
usage against what its store really holds (files on disk, objects listed).

    .venv/bin/python -m bench.chaos.run                        # short profile
    .venv/bin/python -m bench.chaos.run --profile long --json bench/results/chaos_long.json
    .venv/bin/python -m bench.chaos.run --scenarios fs-disk-full,s3-server-kill

Scenarios (a module each in bench/chaos/):
  fs-disk-full     a tmpfs filled by another file mid-run, then freed (root only)
  fs-engine-kills  `kvtiers bench` and a writer killed -9 at random, round after
                   round, on one fs root; then `kvtiers verify` and `kvtiers inspect`
  s3-server-kill   the S3 server killed -9 mid-run and restarted (needs kvtiers-s3
                   and the test servers: rclone, SeaweedFS in the long profile)
  s3-server-freeze the S3 server frozen (SIGSTOP) mid-run, then continued
  redis-server-kill   the tests' redis-server (durable) killed -9 mid-run and
                      restarted, under the example redis tier (kvtiers-redis)
  redis-server-freeze the same server frozen (SIGSTOP), then continued
  p2p-node-kill    a `kvtiers serve` cache node killed -9 while a p2p tier pushes
                   into it and pulls from it, then restarted (it comes back empty)
  p2p-node-freeze  the same node frozen (SIGSTOP), then continued
  damage           fs block files flipped or cut short on disk, s3 objects flipped
                   through boto3, mid-run: never served, one failed load each

Profiles: `short` (about a minute on 2 cores; what tests/bench/test_chaos.py runs)
and `long` (more rounds and outages, bigger disks: several minutes). A scenario
that cannot run here is listed as skipped, with why. Everything runs on loopback
and in a work directory removed at the end (kept, and named, when a scenario
found a problem); mounts are unmounted and servers killed whatever happens.
Exit status: 0 every scenario that ran held its promises, 1 one did not (its
PROBLEM lines say what), 2 bad options. Run from the repository root.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType

from bench.chaos import (
    damage,
    fs_full,
    fs_kills,
    p2p_freeze,
    p2p_node,
    redis_freeze,
    redis_kill,
    s3_freeze,
    s3_kill,
)
from bench.chaos.report import Row, table, write_json

SCENARIOS: dict[str, ModuleType] = {m.NAME: m for m in (
    fs_full, fs_kills, s3_kill, s3_freeze, redis_kill, redis_freeze, p2p_node, p2p_freeze,
    damage)}
PROFILES = ("short", "long")


def _default_dir() -> str:
    """tmpfs where there is one: the fs scenarios then measure the tier, not a disk
    another process keeps busy."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


def run_scenarios(names: list[str], profile: str, base: Path, seed: int,
                  json_out: Path | None = None) -> tuple[list[Row], Path]:
    """Run `names` in order in a fresh work directory under `base`; the rows and
    that directory (already removed unless a row has problems). Each scenario's
    rows are printed to stderr, and `json_out` rewritten, as soon as it ends, so
    that a long run stopped later keeps what it finished."""
    work = Path(tempfile.mkdtemp(prefix="kvtiers-chaos-", dir=base))
    rows: list[Row] = []
    for name in names:
        print(f"running {name} ({profile})...", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            got = SCENARIOS[name].run(profile, work, seed)
        except Exception as exc:  # noqa: BLE001 - a crash is a finding, reported as such
            got = [Row(name, problems=[f"crashed: {exc!r}"],
                       notes=traceback.format_exc().strip().splitlines()[-6:])]
        if len(got) == 1:
            got[0].seconds = time.monotonic() - started
        for row in got:
            row.check()
        rows += got
        print(table(got), file=sys.stderr, flush=True)
        if json_out is not None:
            write_json(json_out, profile, rows)
    if not any(r.problems for r in rows):
        shutil.rmtree(work, ignore_errors=True)
    return rows, work


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.chaos.run", description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", choices=PROFILES, default="short",
                   help="short (the test suite's) or long (default short)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma list of: {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--json", metavar="OUT", help="also write every figure here")
    p.add_argument("--dir", default=None,
                   help="where the work directory goes (default: /dev/shm, else the "
                        "system's temporary directory)")
    p.add_argument("--seed", type=int, default=1, help="seeds kill instants and samples")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        p.error(f"unknown scenario(s) {unknown}; allowed: {', '.join(SCENARIOS)}")
    base = Path(args.dir or _default_dir())
    if not base.is_dir():
        p.error(f"--dir {base}: not a directory")
    rows, work = run_scenarios(names, args.profile, base, args.seed,
                               Path(args.json) if args.json else None)
    print(table(rows))
    if args.json:
        print("wrote", args.json)
    if any(r.problems for r in rows):
        print(f"PROBLEMS found; the work directory is kept: {work}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
