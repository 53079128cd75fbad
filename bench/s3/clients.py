"""The raw clients the benches measure the tier against, on one server: boto3 with a
thread pool, s3fs on one event loop, and the tier's own `ObjectStore` layer
(aiobotocore, or boto3 on threads). Each `put` / `get` returns the pass's seconds
and every request's seconds (`Timed`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kvtiers_s3.client.connect import open_filesystem
from kvtiers_s3.client.objects import ObjectStore
from kvtiers_s3.settings import settings_from_s3

from tests.s3.servers import BOTOCORE_CONFIG, S3Server

__all__ = ["Boto3Threads", "CpuClock", "S3fsAsync", "Timed", "delete_all"]

Timed = tuple[float, list[float]]  # seconds for the pass, per-request seconds


class CpuClock:
    """CPU seconds spent in timed sections, per operation: this process's (the
    client: every thread) and the server process's. On a machine of few cores the
    two share the CPU, so a client that costs less leaves the server more."""

    def __init__(self, server: S3Server):
        import psutil

        assert server.proc is not None
        self._server = psutil.Process(server.proc.pid)
        self.spent: dict[str, tuple[float, float]] = {}  # op -> (client, server) seconds

    def now(self) -> tuple[float, float]:
        times = self._server.cpu_times()
        return time.process_time(), times.user + times.system

    def add(self, op: str, since: tuple[float, float]) -> None:
        client, server = self.now()
        self.spent[op] = (client - since[0], server - since[1])


class Boto3Threads:
    """boto3 with a thread pool: the usual way to go fast with boto3; `unsigned`:
    with the tier's botocore setting that leaves bodies out of the signature."""

    def __init__(self, server: S3Server, concurrency: int, unsigned: bool = False):
        import boto3
        from botocore.config import Config

        # unsigned: request bodies out of the signature, as the tier sends them (no
        # SHA-256 of each body: over http botocore signs it by default)
        extra = {"s3": {"payload_signing_enabled": False}} if unsigned else {}
        self.name = "boto3-threads-unsigned" if unsigned else "boto3-threads"
        self.bucket = server.bucket
        self.client = boto3.client(
            "s3", endpoint_url=server.endpoint_url, region_name="us-east-1",
            aws_access_key_id=server.admin.key, aws_secret_access_key=server.admin.secret,
            config=Config(max_pool_connections=concurrency, **BOTOCORE_CONFIG, **extra))
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


def delete_all(server: S3Server, prefix: str) -> None:
    client = server.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=server.bucket, Prefix=prefix)
    for page in pages:
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=server.bucket, Delete={"Objects": keys, "Quiet": True})
