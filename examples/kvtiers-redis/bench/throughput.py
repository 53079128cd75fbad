"""Throughput of the redis tier against a running server: store then load `--blocks`
random blocks of `--block-kib` KiB in jobs of `--job` blocks, every loaded byte
checked. Prints a table and writes JSON (`--out`). Needs a server you started:

    redis-server --port 6390 --save '' --appendonly no &
    python examples/kvtiers-redis/bench/throughput.py --url redis://127.0.0.1:6390/0
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid

from kvtiers.testing import JobTracker, make_context, make_namespace
from kvtiers_redis.tier import RedisTier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--blocks", type=int, default=512)
    ap.add_argument("--block-kib", type=int, default=256)
    ap.add_argument("--job", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--out", default="redis_throughput.json")
    args = ap.parse_args()
    block = args.block_kib * 1024
    ctx = make_context(block, args.job * 2, namespace=make_namespace("bench", block))
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    tier = RedisTier(ctx, {"url": args.url, "prefix": prefix, "concurrency": args.concurrency,
                           "capacity_bytes": args.blocks * block})
    jobs = JobTracker(tier, timeout_s=600)
    keys = [os.urandom(20) for _ in range(args.blocks)]
    data = {k: os.urandom(block) for k in keys}
    rows = []
    try:
        for kind in ("store", "load"):
            seconds = 0.0
            for at in range(0, len(keys), args.job):
                part = keys[at:at + args.job]
                slots = list(range(len(part)))
                if kind == "store":
                    for slot, k in zip(slots, part, strict=True):
                        ctx.pool.block(slot)[:] = data[k]
                start = time.perf_counter()
                result = (jobs.run_store if kind == "store" else jobs.run_load)(part, slots)
                seconds += time.perf_counter() - start
                assert result.success, result
                if kind == "load":
                    for slot, k in zip(slots, part, strict=True):
                        assert bytes(ctx.pool.block(slot)) == data[k], "wrong bytes"
            nbytes = len(keys) * block
            rows.append({"op": kind, "blocks": len(keys), "block_bytes": block,
                         "job_blocks": args.job, "seconds": seconds,
                         "gb_per_s": nbytes / seconds / 1e9,
                         "blocks_per_s": len(keys) / seconds})
    finally:
        tier.close()
        import redis

        with redis.Redis.from_url(args.url) as raw:
            names = list(raw.scan_iter(match=f"{prefix}:*", count=1000))
            if names:
                raw.delete(*names)
    print(f"{'op':6} {'blocks':>7} {'KiB':>6} {'job':>4} {'GB/s':>7} {'blocks/s':>9}")
    for r in rows:
        print(f"{r['op']:6} {r['blocks']:7d} {r['block_bytes'] // 1024:6d} {r['job_blocks']:4d} "
              f"{r['gb_per_s']:7.3f} {r['blocks_per_s']:9.0f}")
    with open(args.out, "w") as f:
        json.dump({"url_host": args.url.rsplit("@", 1)[-1], "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
