"""Code that runs in child processes (started by a multiprocessing forkserver, so
each one is a real process that the tests may SIGKILL): writers that store blocks
on a root and log the keys the tier reported stored."""

from __future__ import annotations

import os
import random
import time
from typing import Any

from kvtiers.jobs import TransferJob
from kvtiers.keys import make_key

from tests.fs.helpers import BB, block_data, context, open_tier

_ids = iter(range(1, 1 << 62))


def writer(root: str, capacity_blocks: int, seed: int, log_path: str, ready: Any,
           rotate_bytes: int = 0, jobs: int = 0, key_space: int = 0,
           result_queue: Any = None, in_flight: int = 4, block_bytes: int = BB) -> None:
    """Store random blocks forever (or `jobs` jobs), `in_flight` jobs at a time of
    1-8 blocks each; after each job, append the keys reported ok to `log_path`, one
    hex line per key, with one write(2)."""
    if rotate_bytes:
        import kvtiers_fs.store as store_mod

        store_mod.ROTATE_MIN_BYTES = rotate_bytes
    rng = random.Random(seed)
    ctx = context(block_bytes, 8 * in_flight, clock=time.monotonic)
    tier = open_tier(ctx, root, capacity_blocks)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    ready.set()
    done = 0
    while not jobs or done < jobs:
        submitted = []
        for j in range(in_flight):
            n = rng.randint(1, 8)
            if key_space:
                keys = list(dict.fromkeys(make_key(rng.randrange(key_space).to_bytes(16, "big"))
                                          for _ in range(n)))
            else:
                keys = [make_key(rng.randbytes(16)) for _ in range(n)]
            slots = list(range(8 * j, 8 * j + len(keys)))
            for key, slot in zip(keys, slots, strict=True):
                ctx.pool.block(slot)[:] = block_data(key, block_bytes)
            job = TransferJob(next(_ids), keys, slots)
            tier.submit_store(job)
            submitted.append(job.job_id)
        results: dict[int, Any] = {}
        while len(results) < len(submitted):
            for r in tier.get_finished_jobs():
                results[r.job_id] = r
            time.sleep(0.0005)
        lines = b"".join(k.hex().encode() + b"\n" for r in results.values() for k in r.ok)
        if lines:
            os.write(log, lines)
        done += len(submitted)
    stats = tier.stats()
    tier.close()
    if result_queue is not None:
        result_queue.put({"evictions": stats.evictions, "errors": dict(stats.errors),
                          "written": stats.blocks_written})


def read_log(path: str) -> list[bytes]:
    """Keys a writer logged; a line cut by a kill is ignored."""
    try:
        data = open(path, "rb").read()
    except FileNotFoundError:
        return []
    keys = []
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is unfinished
        try:
            keys.append(bytes.fromhex(line.decode()))
        except ValueError:
            pass
    return keys
