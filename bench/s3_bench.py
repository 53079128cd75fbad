#!/usr/bin/env python3
"""kvtiers-s3 benchmark: raw S3 clients and the two object layouts against a real
object store on loopback (SeaweedFS, started here), all in the same run.

    .venv/bin/python bench/s3_bench.py                 # 5 runs, 2 MiB and 64 KiB blocks
    .venv/bin/python bench/s3_bench.py --quick         # smaller, for a smoke run
    .venv/bin/python bench/s3_bench.py --servers seaweedfs rclone moto

Rows (MB/s = 10^6 bytes/s of block bytes; median of --runs runs; every pass writes
new objects and every loaded byte is compared with what was stored):

- raw boto3-threads: boto3 with a thread pool (--concurrency threads, one client, as
  many pooled connections), put_object / get_object, one object per block;
- raw s3fs-async: s3fs on one event loop, `_pipe_file` / `_cat_file` per block under
  asyncio.gather with a semaphore of --concurrency, one object per block;
- raw objectstore: `kvtiers_s3.objects.ObjectStore` (the tier's data layer: s3fs'
  aiobotocore client called directly), same pattern; objectstore-boto3: the same
  layer with boto3 on a thread pool (`client: "boto3"`);
- per-block (objectstore): kvtiers-s3's block records (header + block,
  `kvtiers_s3.codec`), header checked and checksum verified on load;
- nixl-obj (vLLM): vLLM's obj tier's data path, NIXL's OBJ backend as vLLM 0.33
  drives it (one transfer per job, num_threads = --concurrency), in its own
  process (bench/nixl_obj_bench.py; --nixl-path);
- segments-<N>MiB (objectstore): the blocks of each job of --job-blocks blocks
  packed into segments of up to N MiB (`segment.plan_segments`), one PUT each;
  loaded with one ranged GET per block ("load-ranged": a load of scattered
  blocks) and with the job's records coalesced into as few ranged GETs as they
  allow ("load-coalesced", `kvtiers_s3.ranges`: a prefix loaded as it was stored).

Per-request latency (p50/p99 ms) is recorded for every pass. The tier's rows
(`s3-tier/<client>`, `bench/s3_tier_bench.py`) store the same blocks from a pool in
jobs of --job-blocks, all submitted at once, and load them back; their latency is
per job (submit to result). Then: start-up of a tier over a bucket holding
--startup-blocks blocks (4 KiB, both layouts, median of 3 starts), and an outage
(kill -9 of the server, restart): how long loads take to fail, and how long after
the server is back the first load succeeds. Results: bench/results/s3_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
for _dist in ("kvtiers-core", "kvtiers-s3"):
    sys.path.insert(0, str(REPO / _dist / "src"))

from kvtiers_s3 import codec, segment  # noqa: E402
from kvtiers_s3.connect import open_filesystem  # noqa: E402
from kvtiers_s3.objects import ObjectStore  # noqa: E402
from kvtiers_s3.ranges import coalesce  # noqa: E402
from kvtiers_s3.settings import settings_from_s3  # noqa: E402

from bench.s3_tier_bench import outage_bench, startup_bench, tier_pass  # noqa: E402
from tests.s3.servers import BOTOCORE_CONFIG, S3Server, make_server  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
FP = "0123456789abcdef0123456789abcdef"
RESULTS = REPO / "bench" / "results" / "s3_bench.json"

Timed = tuple[float, list[float]]  # seconds for the pass, per-request seconds


# -- clients ------------------------------------------------------------------------


class Boto3Threads:
    """boto3 with a thread pool: the usual way to go fast with boto3."""

    name = "boto3-threads"

    def __init__(self, server: S3Server, concurrency: int):
        import boto3
        from botocore.config import Config

        self.bucket = server.bucket
        self.client = boto3.client(
            "s3", endpoint_url=server.endpoint_url, region_name="us-east-1",
            aws_access_key_id=server.admin.key, aws_secret_access_key=server.admin.secret,
            config=Config(max_pool_connections=concurrency, **BOTOCORE_CONFIG))
        self.pool = ThreadPoolExecutor(concurrency)

    def _map(self, fn: Callable[[Any], Any], items: list[Any]) -> tuple[list[Any], Timed]:
        lat: list[float] = []
        lock = threading.Lock()

        def timed(item: Any) -> Any:
            t = time.perf_counter()
            out = fn(item)
            with lock:
                lat.append(time.perf_counter() - t)
            return out

        start = time.perf_counter()
        out = list(self.pool.map(timed, items))
        return out, (time.perf_counter() - start, lat)

    def put(self, objects: dict[str, bytes]) -> Timed:
        _, t = self._map(lambda kv: self.client.put_object(Bucket=self.bucket, Key=kv[0],
                                                           Body=kv[1]), list(objects.items()))
        return t

    def get(self, names: list[str]) -> tuple[list[bytes], Timed]:
        return self._map(lambda n: self.client.get_object(Bucket=self.bucket, Key=n)["Body"]
                         .read(), names)

    def close(self) -> None:
        self.pool.shutdown()


class S3fsAsync:
    """s3fs on one event loop thread, requests bounded by a semaphore; with
    `objectstore`, through the tier's `ObjectStore` instead of s3fs' methods."""

    def __init__(self, server: S3Server, concurrency: int, objectstore: bool = False,
                 boto3: bool = False):
        self.name = ("objectstore-boto3" if boto3 else "objectstore") if objectstore \
            else "s3fs-async"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        settings = settings_from_s3({"url": f"s3://{server.bucket}", "capacity_bytes": 1,
                                     "storage_options": server.storage_options()})
        self.fs = self._run(self._open(settings, concurrency))
        self.store = ObjectStore(self.fs, settings, boto3_threads=concurrency if boto3 else 0)
        self.objectstore = objectstore
        self.sem = asyncio.Semaphore(concurrency)
        self.bucket = server.bucket

    async def _open(self, settings: Any, concurrency: int) -> Any:
        return open_filesystem(settings, loop=asyncio.get_running_loop(),
                               max_pool_connections=concurrency)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _bounded(self, lat: list[float], coro: Any) -> Any:
        async with self.sem:
            t = time.perf_counter()
            out = await coro
            lat.append(time.perf_counter() - t)
            return out

    def _gather(self, coros: list[Any]) -> tuple[list[Any], Timed]:
        lat: list[float] = []

        async def run() -> list[Any]:
            return list(await asyncio.gather(*(self._bounded(lat, c) for c in coros)))

        start = time.perf_counter()
        out = self._run(run())
        return out, (time.perf_counter() - start, lat)

    def put(self, objects: dict[str, bytes]) -> Timed:
        path = f"{self.bucket}/"
        if self.objectstore:
            _, t = self._gather([self.store.put(path + k, v) for k, v in objects.items()])
        else:
            _, t = self._gather([self.fs._pipe_file(path + k, v) for k, v in objects.items()])
        return t

    def get(self, names: list[str]) -> tuple[list[bytes], Timed]:
        if self.objectstore:
            return self._gather([self.store.get(f"{self.bucket}/{n}") for n in names])
        return self._gather([self.fs._cat_file(f"{self.bucket}/{n}") for n in names])

    def get_ranges(self, ranges: list[tuple[str, int, int]]) -> tuple[list[bytes], Timed]:
        return self._gather([self.store.get(f"{self.bucket}/{n}", s, e) for n, s, e in ranges])

    def close(self) -> None:
        async def shut() -> None:
            await self.store.close()
            if not self.objectstore:
                session = await self.fs.set_session()
                await session.close()

        self._run(shut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def _delete_all(server: S3Server, prefix: str) -> None:
    client = server.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=server.bucket, Prefix=prefix)
    for page in pages:
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=server.bucket, Delete={"Objects": keys, "Quiet": True})


# -- passes -----------------------------------------------------------------------------


def _blocks(n: int, size: int) -> list[tuple[bytes, bytes]]:
    return [(os.urandom(36), os.urandom(size)) for _ in range(n)]


def raw_pass(client: Any, make: Callable[[], list[tuple[bytes, bytes]]],
             prefix: str) -> dict[str, Timed]:
    blocks = make()
    objects = {f"{prefix}/{k.hex()}": v for k, v in blocks}
    put = client.put(objects)
    got, get = client.get(list(objects))
    assert got == list(objects.values()), f"{client.name}: other bytes came back"
    return {"store": put, "load": get}


def per_block_pass(client: S3fsAsync, make: Callable[[], list[tuple[bytes, bytes]]],
                   prefix: str) -> dict[str, Timed]:
    blocks = make()
    t0 = time.perf_counter()
    objects = {f"{prefix}/{k.hex()}": bytes(codec.encode_record(FP, k, v)) for k, v in blocks}
    encode_s = time.perf_counter() - t0
    s, lat = client.put(objects)
    got, (g, glat) = client.get(list(objects))
    t0 = time.perf_counter()  # what the tier does: parse the header, verify the checksum
    views = [codec.decode_record(buf, FP, key=key, payload_bytes=len(payload))[1]
             for (key, payload), buf in zip(blocks, got, strict=True)]
    decode_s = time.perf_counter() - t0
    assert [bytes(v) for v in views] == [p for _, p in blocks]  # untimed
    return {"store": (s + encode_s, lat), "load": (g + decode_s, glat)}


def segment_pass(client: S3fsAsync, make: Callable[[], list[tuple[bytes, bytes]]],
                 prefix: str, *, segment_bytes: int, job_blocks: int) -> dict[str, Timed]:
    blocks = make()
    size = len(blocks[0][1])
    t0 = time.perf_counter()
    objects: dict[str, bytes] = {}
    entries: list[tuple[str, segment.SegmentEntry, bytes]] = []
    for j in range(0, len(blocks), job_blocks):
        job = blocks[j:j + job_blocks]
        for group in segment.plan_segments(len(job), size, 36, segment_bytes):
            members = [job[i] for i in group]
            buf, index = segment.encode_segment(FP, members)
            name = f"{prefix}/seg-{j + group.start:08d}"
            objects[name] = bytes(buf)
            entries += [(name, e, p) for e, (_, p) in zip(index.entries, members, strict=True)]
    encode_s = time.perf_counter() - t0
    s, lat = client.put(objects)

    got, (g, glat) = client.get_ranges([(n, e.offset, e.end) for n, e, _ in entries])
    t0 = time.perf_counter()
    views = [segment.decode_member(buf, entry, FP, payload_bytes=size)[1]
             for (_, entry, _), buf in zip(entries, got, strict=True)]
    ranged_decode = time.perf_counter() - t0
    assert [bytes(v) for v in views] == [p for _, _, p in entries]  # untimed

    # the same blocks, each segment's records coalesced into as few GETs as they allow
    t0 = time.perf_counter()
    reads: list[tuple[str, int, int]] = []
    plans: list[tuple[int, Any]] = []
    by_name: dict[str, list[int]] = {}
    for i, (name, _, _) in enumerate(entries):
        by_name.setdefault(name, []).append(i)
    for name, items in by_name.items():
        for r in coalesce([(i, entries[i][1].offset, entries[i][1].length) for i in items],
                          max_gap=0, max_read=segment_bytes):
            reads.append((name, r.start, r.end))
            plans.append((len(reads) - 1, r))
    plan_s = time.perf_counter() - t0
    bufs, (c, clat) = client.get_ranges(reads)
    t0 = time.perf_counter()
    found: dict[int, memoryview] = {}
    for k, r in plans:
        view = memoryview(bufs[k])
        for item, rel, length in r.members:
            found[item] = segment.decode_member(view[rel:rel + length], entries[item][1], FP,
                                                payload_bytes=size)[1]
    coalesced_decode = time.perf_counter() - t0 + plan_s
    assert [bytes(found[i]) for i in range(len(entries))] == [p for _, _, p in entries]
    return {"store": (s + encode_s, lat), "load-ranged": (g + ranged_decode, glat),
            "load-coalesced": (c + coalesced_decode, clat)}


def nixl_pass(server: S3Server, n: int, bb: int, prefix: str, *, threads: int,
              job_blocks: int, nixl_path: str) -> dict[str, Timed]:
    """vLLM's obj tier's data path (bench/nixl_obj_bench.py), in its own process."""
    cfg = {"endpoint": server.endpoint_url.removeprefix("http://"), "bucket": server.bucket,
           "key": server.admin.key, "secret": server.admin.secret, "prefix": prefix,
           "block_bytes": bb, "blocks": n, "job_blocks": job_blocks, "threads": threads}
    env = {**os.environ, "PYTHONPATH": nixl_path, "NIXL_LOG_LEVEL": "WARN"}
    done = subprocess.run([sys.executable, str(REPO / "bench" / "nixl_obj_bench.py"),
                           json.dumps(cfg)], capture_output=True, text=True, env=env,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"nixl_obj_bench failed: {done.stderr[-2000:]}")
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["match"], "NIXL read back other bytes"
    return {"store": (doc["store"][0], doc["store"][1]), "load": (doc["load"][0], doc["load"][1])}


def nixl_available(nixl_path: str | None) -> bool:
    if not nixl_path:
        return False
    env = {**os.environ, "PYTHONPATH": nixl_path}
    done = subprocess.run([sys.executable, "-c", "import nixl_cu12, numpy"], env=env,
                          capture_output=True, timeout=120)
    return done.returncode == 0


# -- driver -------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def bench_server(server: S3Server, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}

    def record(bb: int, client: str, layout: str, conc: int, n: int,
               result: dict[str, Timed]) -> None:
        for op, (secs, lat) in result.items():
            row = rows.setdefault((bb, client, layout, conc, op), {
                "server": server.kind, "block_bytes": bb, "client": client, "layout": layout,
                "concurrency": conc, "op": op, "blocks": n, "mb_s_runs": [], "requests": 0,
                "lat_ms": []})
            row["mb_s_runs"].append(n * bb / secs / 1e6)
            row["requests"] = len(lat)
            row["lat_ms"] += [x * 1e3 for x in lat]

    for run in range(args.runs):
        for bb in args.block_sizes:
            n = max(4, min(args.max_blocks, args.pass_bytes // bb))
            for conc in args.concurrency:
                boto, s3fs_ = Boto3Threads(server, conc), S3fsAsync(server, conc)
                objs = S3fsAsync(server, conc, objectstore=True)
                objb = S3fsAsync(server, conc, objectstore=True, boto3=True)
                try:
                    blocks = functools.partial(_blocks, n, bb)
                    cases: list[tuple[str, str, Callable[[str], dict[str, Timed]]]] = [
                        ("boto3-threads", "raw", functools.partial(raw_pass, boto, blocks)),
                        ("s3fs-async", "raw", functools.partial(raw_pass, s3fs_, blocks)),
                        ("objectstore", "raw", functools.partial(raw_pass, objs, blocks)),
                        ("objectstore-boto3", "raw", functools.partial(raw_pass, objb, blocks)),
                        ("objectstore", "per-block",
                         functools.partial(per_block_pass, objs, blocks)),
                    ]
                    cases += [("objectstore", f"segments-{seg}MiB", functools.partial(
                        segment_pass, objs, blocks, segment_bytes=seg * MiB,
                        job_blocks=args.job_blocks)) for seg in args.segment_mib]
                    if args.nixl:
                        cases.append(("nixl-obj (vLLM)", "per-block", functools.partial(
                            nixl_pass, server, n, bb, threads=conc, job_blocks=args.job_blocks,
                            nixl_path=args.nixl_path)))
                    # the tier itself: the same blocks, from a pool, in jobs
                    cases += [(f"s3-tier/{client}", f"tier-{packing}", functools.partial(
                        tier_pass, server, blocks, concurrency=conc,
                        job_blocks=args.job_blocks, packing=packing, client=client))
                        for packing, client in (("per_block", "boto3"),
                                                ("per_block", "aiobotocore"),
                                                ("segments", "boto3"))]
                    # rotate the order from run to run: what ran just before matters
                    shift = run % len(cases)
                    for client, layout, fn in cases[shift:] + cases[:shift]:
                        prefix = f"bench-{uuid.uuid4().hex[:8]}"
                        record(bb, client, layout, conc, n, fn(prefix))
                        _delete_all(server, prefix + "/")
                finally:
                    boto.close()
                    s3fs_.close()
                    objs.close()
                    objb.close()
            print(f"  {server.kind}: run {run + 1}/{args.runs}, {bb // KiB} KiB blocks done",
                  file=sys.stderr)
    out = []
    for row in rows.values():
        lat = row.pop("lat_ms")
        row["mb_s"] = statistics.median(row["mb_s_runs"])
        row["p50_ms"], row["p99_ms"] = _pct(lat, 0.5), _pct(lat, 0.99)
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'server':<10} {'block':>7} {'client':<20} {'layout':<16} {'conc':>4} "
            f"{'op':<12} {'MB/s':>8} {'req':>5} {'p50 ms':>8} {'p99 ms':>8}")
    lines = [head, "-" * len(head)]
    key = lambda r: (r["server"], -r["block_bytes"], r["op"].split("-")[0], r["client"],  # noqa: E731
                     r["layout"], r["concurrency"], r["op"])
    for r in sorted(rows, key=key):
        block = f"{r['block_bytes'] // KiB}K" if r["block_bytes"] < MiB else \
            f"{r['block_bytes'] // MiB}M"
        lines.append(f"{r['server']:<10} {block:>7} {r['client']:<20} {r['layout']:<16} "
                     f"{r['concurrency']:>4} {r['op']:<12} {r['mb_s']:>8.0f} {r['requests']:>5} "
                     f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--servers", nargs="+", default=["seaweedfs"],
                        choices=["seaweedfs", "rclone", "moto"])
    parser.add_argument("--block-sizes", nargs="+", type=int, default=[2 * MiB, 64 * KiB])
    parser.add_argument("--pass-bytes", type=int, default=96 * MiB,
                        help="bytes of blocks per pass (each pass writes new objects)")
    parser.add_argument("--max-blocks", type=int, default=512,
                        help="at most this many blocks per pass")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--segment-mib", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--job-blocks", type=int, default=256,
                        help="blocks per store job: segments are packed within a job")
    parser.add_argument("--startup-blocks", type=int, default=100_000,
                        help="blocks in the bucket for the start-up measurement (0: skip)")
    parser.add_argument("--no-outage", dest="outage", action="store_false",
                        help="skip the outage measurement")
    parser.add_argument("--nixl-path", default=os.environ.get("KVTIERS_NIXL_PATH"),
                        help="a directory with nixl_cu12 (pip install --target DIR "
                        "nixl-cu12 numpy): adds vLLM's obj tier's data path (NIXL OBJ)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="1 run, 16 MiB passes")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.pass_bytes, args.concurrency, args.segment_mib = 1, 16 * MiB, [16], [8]
        args.startup_blocks = min(args.startup_blocks, 2000)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on kill
    args.nixl = nixl_available(args.nixl_path)
    if not args.nixl:
        print("  vLLM's obj tier (NIXL OBJ): not run - nixl_cu12 not importable "
              "(--nixl-path)", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    startups: list[dict[str, Any]] = []
    outages: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvtiers-s3-bench-") as tmp:
        for kind in args.servers:
            server = make_server(kind, Path(tmp) / kind)
            try:
                server.start()
                if args.runs:
                    rows += bench_server(server, args)
                if args.startup_blocks:
                    for packing in ("per_block", "segments"):
                        startups.append({"server": kind, **startup_bench(
                            server, f"startup-{packing}", blocks=args.startup_blocks,
                            block_bytes=4096, packing=packing, runs=3)})
                        print(f"  {kind}: start-up over {args.startup_blocks} blocks "
                              f"({packing}) done", file=sys.stderr)
            finally:
                server.stop()
            if args.outage:
                outages.append(outage_bench(kind, Path(tmp) / f"{kind}-outage"))
    print(table(rows))
    for s in startups:
        print(f"start-up  {s['server']:<10} {s['packing']:<10} {s['blocks']} blocks in "
              f"{s['objects']} objects: tier ready in {s['start_s']:.2f} s (listing "
              f"{s['listing_s']:.2f} s; median of {len(s['start_s_runs'])})")
    for o in outages:
        print(f"outage    {o['server']:<10} loads failed {o['loads_fail_after_s']:.2f} s after "
              f"the kill; server back in {o['server_restart_s']:.2f} s; first good load "
              f"{o['first_good_load_after_back_s']:.2f} s after that")
    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"host": platform.node(), "kernel": platform.release(),
                    "python": platform.python_version(), "cpus": os.cpu_count()},
        "runs": args.runs, "pass_bytes": args.pass_bytes, "units": "MB/s = 10^6 B/s of "
        "block bytes, median of runs; latency per request over all runs",
        "nixl": "run" if args.nixl else "not run: nixl_cu12 not importable",
        "rows": rows,
        "startup": startups,
        "outage": outages,
    }
    if not args.quick or args.json != RESULTS:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
