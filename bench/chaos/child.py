"""The writer `fs_kills` starts and kills: an engine-side fs tier on a shared root,
storing batches of random blocks (`block_data` of each key: new random keys, or
keys drawn from a space that other writers share) until it is killed or has run
`--jobs` jobs (at most `--blocks-per-s`, so that a run of any length stays within
the tier's capacity). After every store job it appends the keys reported stored
to `--log`, one hex key a line, flushed, so whoever kills it knows what the tier
promised. Every tenth job it loads back a stored batch; a block served with
other bytes is logged as `WRONG <first key of the batch> <bytes>`, and each job
longer than all before it as `WAIT <seconds>`.

    python -m bench.chaos.child --root DIR --capacity BYTES --log FILE
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time

from kvtiers.sdk import make_key
from kvtiers.testing import random_keys

from bench.chaos.driver import Driver, open_tier
from bench.chaos.report import Row

MODEL = "chaos-fs-writer"
BLOCK = 16384


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="the fs tier's root_dir")
    p.add_argument("--capacity", type=int, required=True, help="capacity_bytes")
    p.add_argument("--log", required=True, help="where keys reported stored are appended")
    p.add_argument("--jobs", type=int, default=100_000, help="stop after this many stores")
    p.add_argument("--seed", type=int, default=0, help="seeds which batches are read back")
    p.add_argument("--blocks-per-s", type=float, default=0.0,
                   help="store at most this many blocks a second (0: as fast as it can)")
    p.add_argument("--key-space", type=int, default=0,
                   help="draw keys from this many, named by --key-space-seed (writers given "
                        "the same ones store the same keys); 0: new random keys")
    p.add_argument("--key-space-seed", default="", help="names the key space")
    args = p.parse_args()
    if args.key_space and args.key_space < 8:
        p.error(f"--key-space {args.key_space}: 0, or at least 8 (one job's keys)")
    rng = random.Random(args.seed)
    space = [make_key(hashlib.sha256(f"{args.key_space_seed}:{i}".encode()).digest())
             for i in range(args.key_space)]
    tier = open_tier({"type": "fs", "root_dir": args.root, "capacity_bytes": args.capacity},
                     MODEL, BLOCK)
    row = Row("child")
    drive = Driver(tier, row)
    batches: list[list[bytes]] = []
    start = time.monotonic()
    with open(args.log, "a", buffering=1) as log:
        try:
            for n in range(args.jobs):
                if args.blocks_per_s:
                    time.sleep(max(0.0, n * 8 / args.blocks_per_s - (time.monotonic() - start)))
                keys = rng.sample(space, 8) if space else random_keys(8)
                longest = row.longest_wait_s
                result = drive.store(keys)
                if row.longest_wait_s > longest:
                    log.write(f"WAIT {row.longest_wait_s:.6f}\n")
                ok = [k for k in keys if k in result.ok]
                if ok:
                    batches.append(ok)
                    log.write("".join(k.hex() + "\n" for k in ok))
                if n % 10 == 9 and batches:
                    before = row.wrong_bytes
                    back = rng.choice(batches)
                    drive.load(back)
                    if row.wrong_bytes != before:
                        log.write(f"WRONG {back[0].hex()} {row.wrong_bytes - before}\n")
        finally:
            tier.close()


if __name__ == "__main__":
    main()
