"""The real servers the s3 tests run against: the async data path works on each, and
an outage (SIGKILL, restart on the same port) behaves as the outage tests expect."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError
from kvtiers_s3.client.connect import open_filesystem
from kvtiers_s3.settings import settings_from_s3

from tests.s3.servers import S3Server


def _fs(server: S3Server, root: str, loop: asyncio.AbstractEventLoop | None = None,
        **overrides: Any) -> Any:
    settings = settings_from_s3({"url": f"s3://{root}", "capacity_bytes": 1,
                                 "storage_options": server.storage_options()})
    return open_filesystem(settings, loop=loop, **overrides)


def test_concurrent_async_puts_and_ranged_gets_return_the_bytes(
        s3_server: S3Server, s3_prefix: str) -> None:
    blobs = {f"{s3_prefix}/obj-{i}": os.urandom(100_000 + i) for i in range(24)}

    async def run() -> None:
        fs = _fs(s3_server, s3_prefix, loop=asyncio.get_running_loop())
        await asyncio.gather(*(fs._pipe_file(name, data) for name, data in blobs.items()))
        whole = await asyncio.gather(*(fs._cat_file(name) for name in blobs))
        assert whole == list(blobs.values())
        ranged = await asyncio.gather(*(fs._cat_file(n, start=1000, end=5000) for n in blobs))
        assert ranged == [d[1000:5000] for d in blobs.values()]
        listed = await fs._find(s3_prefix, detail=True)
        assert {k: v["size"] for k, v in listed.items()} == {k: len(v) for k, v in blobs.items()}
        session = await fs.set_session()
        await session.close()

    asyncio.run(run())


def test_a_killed_server_refuses_and_comes_back_on_its_port(private_server: S3Server) -> None:
    server = private_server
    name = f"{server.bucket}/kept"
    data = os.urandom(50_000)
    fs = _fs(server, server.bucket, connect_timeout=1, read_timeout=2,
             retries={"total_max_attempts": 1})
    fs.retries = 1  # s3fs' own retry loop
    fs.pipe_file(name, data)
    server.kill()
    assert not server.running
    with pytest.raises((OSError, BotoCoreError)):
        fs.cat_file(name)
    server.start()
    fs.invalidate_cache()
    if server.kind == "moto":  # in memory: back empty, with the bucket re-created
        assert not fs.exists(name)
    else:
        assert fs.cat_file(name) == data
