"""The s3 tier's part of bench/s3_bench.py and bench/s3_store_ab.py: the tier's own
store/load passes (the same blocks and concurrency as the raw clients; latency per
request, as the tier timed each PUT and GET, and per job), start-up over a bucket
holding 100 000 blocks, and recovery after an outage."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.contract.tier import TierContext
from kvtiers_s3.client.body import joined
from kvtiers_s3.client.connect import open_filesystem
from kvtiers_s3.client.objects import ObjectStore
from kvtiers_s3.layout import codec, segment
from kvtiers_s3.layout.names import block_name, namespace_root, segment_name
from kvtiers_s3.settings import settings_from_s3
from kvtiers_s3.tier import S3Tier

from bench.s3.clients import CpuClock
from tests.s3.servers import S3Server, make_server

Timed = tuple[float, list[float]]
MiB = 1 << 20


def _namespace(block_bytes: int) -> Namespace:
    geometry = BlockGeometry(layers=1, kv_heads=1, head_size=block_bytes // 2, dtype="uint8",
                             tokens_per_block=1)
    return Namespace("kvtiers-bench/s3", (geometry,))


def _options(server: S3Server, prefix: str, **extra: Any) -> dict[str, Any]:
    return {"url": f"s3://{server.bucket}/{prefix}", "capacity_bytes": 1 << 40,
            "storage_options": server.storage_options(), "shared": False, "rescan_s": 0,
            **extra}


def _run_jobs(tier: S3Tier, keys: list[bytes], first_slot: int, job_blocks: int,
              load: bool) -> Timed:
    """Submit every job at once; seconds until the last result, and each job's
    latency (submit to result)."""
    from kvtiers.contract.jobs import TransferJob

    start = time.perf_counter()
    pending: set[int] = set()
    for j, first in enumerate(range(0, len(keys), job_blocks)):
        ks = keys[first:first + job_blocks]
        job = TransferJob(j + 1, ks, list(range(first_slot + first, first_slot + first + len(ks))))
        (tier.submit_load if load else tier.submit_store)(job)
        pending.add(job.job_id)
    latencies: list[float] = []
    while pending:
        for result in tier.get_finished_jobs():
            assert result.success, f"{'load' if load else 'store'} failed: {result.reasons()}"
            pending.discard(result.job_id)
            latencies.append(time.perf_counter() - start)
        time.sleep(0.002)  # an engine steps every few ms; finer polling only burns CPU
    return time.perf_counter() - start, latencies


def tier_pass(server: S3Server, make: Callable[[], list[tuple[bytes, bytes]]], prefix: str,
              *, concurrency: int, job_blocks: int, packing: str, client: str,
              layout: dict[str, Any] | None = None,
              per_job: dict[str, list[float]] | None = None,
              copied_body: bool = False, cpu: CpuClock | None = None) -> dict[str, Timed]:
    """The tier storing the blocks from a pool and loading them back into it: per
    operation the pass's seconds and each request's (every PUT and GET the tier
    made, `S3Tier.latency`); each job's latency (submit to result) is added to
    `per_job` ("store", "load") when given. `copied_body`: the store path before
    session 6, for a same-run A/B - each object's parts copied into one buffer on
    the request's thread and that PUT, instead of sent from the slots. `cpu`: the
    CPU seconds of each timed section are added to it."""
    blocks = make()
    n, bb = len(blocks), len(blocks[0][1])
    pool = PoolView.anonymous(2 * n, bb)
    for i, (_, payload) in enumerate(blocks):
        pool.block(i)[:] = payload
    poison = b"\xa5" * bb  # the load slots touched too: a real pool is resident (pinned)
    for i in range(n, 2 * n):
        pool.block(i)[:] = poison
    ctx = TierContext(pool, _namespace(bb), clock=time.monotonic, name="bench")
    tier = S3Tier(ctx, _options(server, prefix, concurrency=concurrency, client=client,
                                layout={"packing": packing, **(layout or {})}))
    if copied_body:
        _copy_bodies(tier)
    try:
        keys = [k for k, _ in blocks]
        since = cpu.now() if cpu else None
        store_s, store_jobs = _run_jobs(tier, keys, 0, job_blocks, load=False)
        if cpu and since:
            cpu.add("store", since)
            since = cpu.now()
        load_s, load_jobs = _run_jobs(tier, keys, n, job_blocks, load=True)
        if cpu and since:
            cpu.add("load", since)
        for i, (_, payload) in enumerate(blocks):  # untimed: every byte checked
            assert bytes(pool.block(n + i)) == payload, "the tier loaded other bytes"
        requests = {op: tier.latency.values(op) for op in ("store", "load")}
    finally:
        tier.close()
    if per_job is not None:
        per_job.setdefault("store", []).extend(store_jobs)
        per_job.setdefault("load", []).extend(load_jobs)
    return {"store": (store_s, requests["store"]), "load": (load_s, requests["load"])}


def _copy_bodies(tier: S3Tier) -> None:
    """Make the tier's PUTs copy each object's parts into one buffer first (the
    store path before `body.PartsBody`): bench-only, on this tier's own store."""
    store = tier._store
    send = store.put_made

    async def put_made(name: str, make: Callable[[], Any]) -> bool:
        def copied() -> Any:
            parts = make()
            return None if parts is None else [joined(parts)]

        return await send(name, copied)

    store.put_made = put_made  # type: ignore[method-assign]


# -- start-up over a full bucket ------------------------------------------------------------


async def _populate(server: S3Server, prefix: str, ns: Namespace, n: int, bb: int,
                    packing: str) -> int:
    """Write `n` blocks of the namespace straight into the bucket; returns objects."""
    settings = settings_from_s3(_options(server, prefix))
    store = ObjectStore(open_filesystem(settings, loop=asyncio.get_running_loop(),
                                        max_pool_connections=64), settings)
    root = namespace_root(settings.root, ns.fingerprint)
    payload = os.urandom(bb)
    sem = asyncio.Semaphore(64)

    async def put(name: str, data: bytes | bytearray) -> None:
        async with sem:
            await store.put(name, data)

    keys = [os.urandom(36) for _ in range(n)]
    if packing == "per_block":
        work = [put(block_name(root, k), codec.encode_record(ns.fingerprint, k, payload))
                for k in keys]
    else:
        work = []
        for seq, group in enumerate(segment.plan_segments(n, bb, 36, 8 * MiB)):
            data, _ = segment.encode_segment(ns.fingerprint, [(keys[i], payload) for i in group])
            work.append(put(segment_name(root, 1, seq), data))
    await asyncio.gather(*work)
    await store.close()
    return len(work)


def startup_bench(server: S3Server, prefix: str, *, blocks: int, block_bytes: int,
                  packing: str, runs: int) -> dict[str, Any]:
    ns = _namespace(block_bytes)
    t0 = time.perf_counter()
    objects = asyncio.run(_populate(server, prefix, ns, blocks, block_bytes, packing))
    populate_s = time.perf_counter() - t0
    starts, listings, found = [], [], 0
    for _ in range(runs):
        ctx = TierContext(PoolView.anonymous(4, block_bytes), ns, clock=time.monotonic,
                          name="bench")
        t = time.perf_counter()
        tier = S3Tier(ctx, _options(server, prefix, layout={"packing": packing}))
        starts.append(time.perf_counter() - t)
        assert tier.startup is not None
        listings.append(tier.startup.seconds)
        found = len(tier.startup.objects)
        tier.close()  # writes the recency manifest the next start applies
    return {"packing": packing, "blocks": blocks, "block_bytes": block_bytes,
            "objects": objects, "found_objects": found, "populate_s": populate_s,
            "start_s_runs": starts, "start_s": statistics.median(starts),
            "listing_s": statistics.median(listings)}


# -- an outage ------------------------------------------------------------------------------


def outage_bench(kind: str, root: Path, block_bytes: int = 64 * 1024) -> dict[str, Any]:
    """Seconds for loads to fail once the server is killed, for it to come back, and
    for the tier's first successful load after it is back."""
    server = make_server(kind, root)
    server.start()
    try:
        n = 32
        pool = PoolView.anonymous(2 * n, block_bytes)
        for i in range(n):
            pool.block(i)[:] = os.urandom(block_bytes)
        ctx = TierContext(pool, _namespace(block_bytes), clock=time.monotonic, name="bench")
        tier = S3Tier(ctx, _options(server, "outage", timeout_s=2,
                                    layout={"packing": "per_block"}))
        try:
            from kvtiers.contract.jobs import TransferJob

            keys = [os.urandom(36) for _ in range(n)]
            _run_jobs(tier, keys, 0, 8, load=False)
            server.kill()
            t = time.perf_counter()
            tier.submit_load(TransferJob(1000, keys, list(range(n, 2 * n))))
            while not (done := tier.get_finished_jobs()):
                time.sleep(0.001)
            fail_s = time.perf_counter() - t
            assert not done[0].ok, "loads succeeded with the server down"
            t = time.perf_counter()
            server.start()
            restart_s = time.perf_counter() - t
            back = time.perf_counter()
            attempt = 2000
            while True:
                attempt += 1
                tier.submit_load(TransferJob(attempt, keys, list(range(n, 2 * n))))
                while not (done := tier.get_finished_jobs()):
                    time.sleep(0.001)
                if done[0].success:
                    break
                time.sleep(0.05)
            recovery_s = time.perf_counter() - back
        finally:
            tier.close()
    finally:
        server.stop()
    return {"server": kind, "loads_fail_after_s": fail_s, "server_restart_s": restart_s,
            "first_good_load_after_back_s": recovery_s}
