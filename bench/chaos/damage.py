"""Stored blocks damaged behind the tier's back, mid-run, with raw tools: fs block
files with one byte flipped or cut short on disk, s3 objects (one per block) with
one byte flipped through a raw boto3 client, in both layouts: one object per
block, and packed segments (a flipped segment damages every block it holds, as
far as the check goes).

Each case stores random blocks, damages a share of them while it goes on storing
and loading, then asks for the damaged keys the way a scheduler does: `lookup`
first, and a load only on HIT, for a few passes. A damaged block must never be
served (wrong bytes 0: the tiers verify what they load), must fail at most one
load (`corrupt`, or `missing` for a file cut short) and answer MISS from then on;
a damaged block served with its right bytes had its damage outside them (a
file's padding): counted as `damaged:served-right`, never a problem. Every
undamaged block must still load with its bytes (lost 0), and usage must equal what
the store holds once the tier has dropped the damaged ones. Each row's errors hold
`damaged:KIND` (keys damaged) and `refailed` (keys that failed more than one load,
a problem). The s3 case is skipped without kvtiers-s3, boto3 or
rclone."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kvtiers.sdk import BlockKey, LookupResult

from bench.chaos import s3_kill
from bench.chaos.driver import Driver, open_tier
from bench.chaos.report import Row
from tests.fs.helpers import disk_files

NAME = "damage"
BLOCK = 16384
#: batches stored before the damage and while it goes on, keys damaged, passes of
#: lookup-then-load over the damaged keys
PROFILES: dict[str, dict[str, Any]] = {
    "short": {"before": 6, "during": 4, "damaged": 12, "passes": 3},
    "long": {"before": 60, "during": 40, "damaged": 120, "passes": 5},
}
#: damages the object holding a key; returns the keys that object holds (of those given)
Damage = Callable[[BlockKey, Iterable[BlockKey]], list[BlockKey]]


def run(profile: str, workdir: Path, seed: int) -> list[Row]:
    p = PROFILES[profile]
    cases: list[Callable[[random.Random], Row]] = [
        lambda rng: _fs(p, workdir, rng, "flip"),
        lambda rng: _fs(p, workdir, rng, "truncate"),
        lambda rng: _s3(p, workdir, rng, "per_block"),
        lambda rng: _s3(p, workdir, rng, "segments")]
    rows = []
    for i, case in enumerate(cases):
        started = time.monotonic()
        rows.append(case(random.Random(seed + i)))
        rows[-1].seconds = time.monotonic() - started
    return rows


def _flip(path: Path, rng: random.Random) -> None:
    """One byte of `path`, anywhere, XORed with a non-zero value, in place."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        at = rng.randrange(size)
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ rng.randrange(1, 256)]))


def _fs(p: dict[str, Any], workdir: Path, rng: random.Random, kind: str) -> Row:
    row = Row(f"{NAME} (fs {kind})")
    root = workdir / f"damage-fs-{kind}"
    root.mkdir(parents=True)
    tier = open_tier({"type": "fs", "root_dir": str(root), "capacity_bytes": 1 << 30},
                     "chaos-damage", BLOCK)
    ns = root / tier.ctx.namespace.fingerprint

    def damage(key: BlockKey, known: Iterable[BlockKey]) -> list[BlockKey]:
        [path] = ns.glob(f"blocks/*/{bytes(key).hex()}.kvb")
        if kind == "flip":
            _flip(path, rng)
        else:
            os.truncate(path, rng.randrange(path.stat().st_size))
        return [key]

    try:
        _case(p, Driver(tier, row), rng, damage, f"damaged:{kind}", p["damaged"])
        row.usage_bytes = tier.stats().usage_bytes
        row.store_bytes = disk_files(ns)[1]
    finally:
        tier.close()
    return row


def _s3(p: dict[str, Any], workdir: Path, rng: random.Random, packing: str) -> Row:
    row = Row(f"{NAME} (s3 {packing} flip)")
    why = s3_kill._missing("rclone")
    if why:
        row.skipped = why
        return row
    from tests.s3.servers import start_server

    with start_server("rclone", workdir / f"damage-s3-{packing}") as server:
        tier = open_tier({"type": "s3", "url": f"s3://{server.bucket}/{s3_kill.PREFIX}",
                          "capacity_bytes": 1 << 30, "storage_options": server.storage_options(),
                          "layout": {"packing": packing}, "rescan_s": s3_kill.RESCAN_S},
                         "chaos-damage", BLOCK)
        client = server.client()
        base = f"{s3_kill.PREFIX}/{tier.ctx.namespace.fingerprint}/"
        part = "b/" if packing == "per_block" else "s/"

        def damage(key: BlockKey, known: Iterable[BlockKey]) -> list[BlockKey]:
            """Flip a byte of the object holding `key` (its own, or its segment,
            found by the key's bytes in each record); the keys that object holds."""
            names = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=server.bucket, Prefix=base + part) for o in page.get("Contents", [])]
            for name in names:
                if part == "b/" and bytes(key).hex() not in name:
                    continue
                body = bytearray(client.get_object(Bucket=server.bucket,
                                                   Key=name)["Body"].read())
                if bytes(key) not in body:
                    continue
                held = [k for k in known if bytes(k) in body]
                body[rng.randrange(len(body))] ^= rng.randrange(1, 256)
                client.put_object(Bucket=server.bucket, Key=name, Body=bytes(body))
                return held
            raise AssertionError(f"no object under {base + part} holds {bytes(key).hex()}")

        try:
            targets = p["damaged"] if packing == "per_block" else p["damaged"] // 4
            _case(p, Driver(tier, row), rng, damage, "damaged:flip", targets)
            s3_kill._settle(tier, server, row)
        finally:
            tier.close()
    return row


def _case(p: dict[str, Any], drive: Driver, rng: random.Random, damage: Damage,
          label: str, targets: int) -> None:
    """`targets` stored keys damaged (with every key their object holds) while the
    tier goes on storing and loading others; then the checks of the module doc."""
    row = drive.row
    for _ in range(p["before"]):
        drive.store()
    chosen = rng.sample(list(drive.stored), targets)
    victims: dict[BlockKey, None] = {}
    per_batch = -(-len(chosen) // p["during"])
    for i in range(p["during"]):
        for key in chosen[i * per_batch:(i + 1) * per_batch]:
            for hit in damage(key, list(drive.stored)):
                if hit not in victims:
                    victims[hit] = None
                    row.errors[label] += 1
        fresh = drive.store()
        drive.load(list(fresh.ok))
        row.rounds += 1
    # Asked for as a scheduler asks: a load only where lookup answers HIT.
    # A block served is checked byte for byte (wrong bytes): one served right had
    # its damage where no byte of the block is (a file's padding, say): harmless.
    failed: Counter[BlockKey] = Counter()
    served: set[BlockKey] = set()
    for _ in range(p["passes"]):
        hits = [k for k in victims if drive.timed.lookup(k) is LookupResult.HIT]
        for i in range(0, len(hits), drive.batch):
            result = drive.load(hits[i:i + drive.batch])
            failed.update(list(result.failed))
            served.update(result.ok)
    if served:
        row.errors["damaged:served-right"] += len(served)
    still = [k for k in victims if k not in served
             and drive.timed.lookup(k) is LookupResult.HIT]
    refailed = [k for k, n in failed.items() if n > 1]
    row.errors["refailed"] += len(refailed)
    if refailed:
        row.problems.append(f"{len(refailed)} damaged keys failed more than one load")
    if still:
        row.problems.append(f"{len(still)} damaged keys still answer HIT after "
                            f"{p['passes']} passes")
    if not failed:
        row.problems.append("no damaged key failed a load: the damage had no effect")
    row.notes.append(f"{len(victims)} keys damaged, {sum(failed.values())} failed loads "
                     f"of them")
    kept = [k for k in drive.stored if k not in victims]
    drive.check_all(kept)
