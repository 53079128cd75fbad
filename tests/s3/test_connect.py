"""The tier's S3 clients (boto3 and s3fs' aiobotocore) sign requests without their
bodies (SigV4's UNSIGNED-PAYLOAD: no SHA-256 of every PUT on the client), every
server accepts that, and a user's `config_kwargs` can turn it back on; the bytes
stored are the bytes read back, on real servers."""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from typing import Any

import pytest
from kvtiers_s3.client.connect import boto3_client, botocore_config, open_filesystem
from kvtiers_s3.client.objects import ObjectStore
from kvtiers_s3.settings import S3Settings, settings_from_s3

from tests.s3.servers import S3Server

HEADER = "x-amz-content-sha256"


def _settings(server: S3Server, **config: Any) -> S3Settings:
    options = server.storage_options()
    options["config_kwargs"] = {**options["config_kwargs"], **config}
    return settings_from_s3({"url": f"s3://{server.bucket}/p", "capacity_bytes": 1,
                             "storage_options": options})


def test_the_s3_options_merge_key_by_key() -> None:
    assert botocore_config(None, {})["s3"] == {"payload_signing_enabled": False}
    merged = botocore_config({"s3": {"addressing_style": "path"}, "read_timeout": 3}, {})
    assert merged["s3"] == {"payload_signing_enabled": False, "addressing_style": "path"}
    assert merged["read_timeout"] == 3
    assert botocore_config({"s3": {"payload_signing_enabled": True}}, {})["s3"] == {
        "payload_signing_enabled": True}


@pytest.mark.parametrize("config, signed", [
    ({}, False),
    ({"s3": {"addressing_style": "path"}}, False),
    ({"s3": {"payload_signing_enabled": True}}, True),
])
def test_boto3_puts_are_unsigned_unless_asked(s3_server: S3Server, config: dict[str, Any],
                                              signed: bool) -> None:
    client = boto3_client(_settings(s3_server, **config))
    seen: list[str] = []
    client.meta.events.register("before-send.s3.PutObject",
                                lambda request, **_: seen.append(request.headers[HEADER]))
    key, body = f"connect-{uuid.uuid4().hex}", os.urandom(300_000)
    try:
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=bytearray(body))
        got = client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
        assert got == body
    finally:
        client.delete_object(Bucket=s3_server.bucket, Key=key)
        client.close()
    sent = seen[0].decode() if isinstance(seen[0], bytes) else seen[0]
    assert sent == (hashlib.sha256(body).hexdigest() if signed else "UNSIGNED-PAYLOAD")


def test_the_aiobotocore_path_is_unsigned_too(s3_server: S3Server) -> None:
    settings = _settings(s3_server)
    name, body = f"{s3_server.bucket}/connect-{uuid.uuid4().hex}", os.urandom(200_000)
    seen: list[Any] = []

    async def run() -> bytes:
        store = ObjectStore(open_filesystem(settings, loop=asyncio.get_running_loop()), settings)
        client = await store._client()
        client.meta.events.register("before-send.s3.PutObject",
                                    lambda request, **_: seen.append(request.headers[HEADER]))
        try:
            await store.put(name, body)
            return await store.get(name)
        finally:
            await store.delete([name])
            await store.close()

    assert asyncio.run(run()) == body
    sent = seen[0].decode() if isinstance(seen[0], bytes) else seen[0]
    assert sent == "UNSIGNED-PAYLOAD"
