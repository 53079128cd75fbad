"""`ObjectStore` on every real server and on fsspec's memory:// and file://: the
same operations, the same errors."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers_s3.client.connect import open_filesystem
from kvtiers_s3.client.objects import ObjectStore, classify
from kvtiers_s3.layout.names import BLOCKS, block_name, namespace_root, shard_prefixes
from kvtiers_s3.settings import S3Settings, settings_from_s3

from tests.s3.servers import S3Server, free_port

FP = "0123456789abcdef0123456789abcdef"


def _run(settings: S3Settings, body: Callable[[ObjectStore], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        fs = open_filesystem(settings, loop=asyncio.get_running_loop())
        store = ObjectStore(fs, settings)
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(main())


async def _exercise(store: ObjectStore) -> None:
    ns = namespace_root(store.settings.root, FP)
    blobs = {block_name(ns, os.urandom(36)): os.urandom(70_000) for _ in range(20)}
    await asyncio.gather(*(store.put(n, bytearray(d)) for n, d in blobs.items()))
    got = await asyncio.gather(*(store.get(n) for n in blobs))
    assert got == list(blobs.values())
    ranged = await asyncio.gather(*(store.get(n, 100, 2100) for n in blobs))
    assert ranged == [d[100:2100] for d in blobs.values()]
    name = next(iter(blobs))
    assert await store.get(name, 69_990, 80_000) == blobs[name][69_990:]  # past the end
    assert await store.size(name) == 70_000
    assert await store.size(name + "0") is None
    with pytest.raises(FileNotFoundError):
        await store.get(name + "0")
    listed = await store.list_objects(f"{ns}/{BLOCKS}/", shard_prefixes(ns, BLOCKS))
    assert {i.name: i.size for i in listed} == {n: 70_000 for n in blobs}
    store.page_size = 3  # past the first page: page after page, or the shards at once
    for pages in (0, 1000):
        store.sequential_pages = pages
        again = await store.list_objects(f"{ns}/{BLOCKS}/", shard_prefixes(ns, BLOCKS))
        assert sorted(again, key=lambda i: i.name) == sorted(listed, key=lambda i: i.name)
    assert all(i.mtime is not None and i.mtime > 1e9 for i in listed)
    doomed = list(blobs)[:15]
    await store.delete([*doomed, block_name(ns, b"never-written")])
    left = await store.list_objects(f"{ns}/{BLOCKS}/")
    assert {i.name for i in left} == set(list(blobs)[15:])


def test_every_operation_on_a_real_server(s3_server: S3Server, s3_prefix: str) -> None:
    settings = settings_from_s3({"url": f"s3://{s3_prefix}", "capacity_bytes": 1,
                                 "storage_options": s3_server.storage_options()})
    _run(settings, _exercise)


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_every_operation_without_a_server(tmp_path: Path, scheme: str) -> None:
    url = f"memory://kvtiers-test-{os.getpid()}/{tmp_path.name}" if scheme == "memory" \
        else f"file://{tmp_path}/root"
    _run(settings_from_s3({"url": url, "capacity_bytes": 1}), _exercise)


def test_failures_are_classified_for_job_results() -> None:
    settings = settings_from_s3({
        "url": "s3://kvtiers-test/x", "capacity_bytes": 1,
        "storage_options": {"endpoint_url": f"http://127.0.0.1:{free_port()}",
                            "key": "AKIDCLASSIFY", "secret": "classify-secret-000",
                            "config_kwargs": {"retries": {"total_max_attempts": 1}}}})

    async def body(store: ObjectStore) -> BaseException:
        try:
            await store.get("kvtiers-test/x/y")
        except Exception as exc:  # noqa: BLE001 - what is raised is the point
            return exc
        raise AssertionError("a get from a closed port succeeded")

    exc = _run(settings, body)
    assert classify(exc) is FailureReason.IO
    assert classify(FileNotFoundError("x")) is FailureReason.MISSING
    assert classify(TimeoutError()) is FailureReason.TIMEOUT
