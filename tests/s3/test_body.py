"""`PartsBody`: a PUT's body sent from its parts (headers and pool slots) where they
lie. Its reads give every byte once, in order; botocore sizes it, signs it when
asked (reading it, then rewinding) and rewinds it for a retry; the bytes stored on
every server are the parts' bytes."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import random
import uuid
from typing import Any

import pytest
from kvtiers_s3.client.body import PartsBody, joined
from kvtiers_s3.client.connect import open_filesystem
from kvtiers_s3.client.objects import ObjectStore
from kvtiers_s3.settings import settings_from_s3

from tests.s3.servers import S3Server


def _parts(rng: random.Random) -> list[Any]:
    out: list[Any] = []
    for _ in range(rng.randint(0, 7)):
        data = rng.randbytes(rng.choice([0, 1, 2, 7, 110, 5000]))
        out.append(rng.choice([bytes, bytearray, memoryview])(data))
    return out


def test_reads_give_every_byte_once_in_order_from_any_position() -> None:
    rng = random.Random(13)
    for _ in range(500):
        parts = _parts(rng)
        whole = b"".join(bytes(p) for p in parts)
        body = PartsBody(parts)
        assert len(body) == len(whole)
        start = rng.randint(0, len(whole))
        assert body.seek(start) == start == body.tell()
        got = []
        while chunk := body.read(rng.choice([1, 3, 16384])):
            assert len(chunk) > 0
            got.append(bytes(chunk))
        assert b"".join(got) == whole[start:]
        assert body.tell() == len(whole)
        assert body.read(5) == b""
        body.seek(-min(3, len(whole)), io.SEEK_END)
        assert body.read() == whole[-min(3, len(whole)):] if whole else body.read() == b""
        body.seek(0)
        assert body.read(-1) == whole
        assert bytes(joined(parts)) == whole


def test_a_read_hands_out_the_part_itself_not_a_copy() -> None:
    slot = bytearray(os.urandom(1 << 20))
    body = PartsBody([b"header", slot])
    assert body.read(16384) == b"header"
    view = body.read(16384)  # a whole part, however little was asked for
    assert isinstance(view, memoryview) and view.nbytes == len(slot)
    slot[0] ^= 0xFF
    assert view[0] == slot[0]  # the slot's own memory
    with pytest.raises(ValueError):
        body.seek(-1)
    body.close()  # the slots let go of
    body.seek(0)
    assert body.read(10) == b"" and body.read() == b""


def _store(server: S3Server, **config: Any) -> tuple[ObjectStore, asyncio.AbstractEventLoop]:
    options = server.storage_options()
    options["config_kwargs"] = {**options["config_kwargs"], **config}
    settings = settings_from_s3({"url": f"s3://{server.bucket}/p", "capacity_bytes": 1,
                                 "storage_options": options})
    loop = asyncio.new_event_loop()
    fs = open_filesystem(settings, loop=loop, max_pool_connections=4)
    return ObjectStore(fs, settings, boto3_threads=2), loop


@pytest.mark.parametrize("signed", [False, True])
def test_every_server_stores_the_parts_bytes(s3_server: S3Server, signed: bool) -> None:
    store, loop = _store(s3_server, **({"s3": {"payload_signing_enabled": True}} if signed
                                       else {}))
    parts = [os.urandom(110), bytearray(os.urandom(300_000)), b"", os.urandom(7),
             memoryview(bytearray(os.urandom(200_000)))]
    whole = b"".join(bytes(p) for p in parts)
    sent: list[Any] = []
    assert store._boto3 is not None
    store._boto3.client.meta.events.register(
        "before-send.s3.PutObject",
        lambda request, **_: sent.append((type(request.body), request.headers)))
    name = f"{s3_server.bucket}/body-{uuid.uuid4().hex}"
    try:
        assert loop.run_until_complete(store.put_made(name, lambda: parts))
        assert loop.run_until_complete(store.get(name)) == whole
        body_type, headers = sent[0]
        assert body_type is PartsBody  # sent from the parts, not joined first
        sha = headers["x-amz-content-sha256"]
        sha = sha.decode() if isinstance(sha, bytes) else sha
        assert sha == (hashlib.sha256(whole).hexdigest() if signed else "UNSIGNED-PAYLOAD")
        assert int(headers["Content-Length"]) == len(whole)
    finally:
        loop.run_until_complete(store.delete([name]))
        loop.run_until_complete(store.close())
        loop.close()


def test_a_retried_put_sends_the_body_again_from_its_start(moto: S3Server) -> None:
    """The first attempt dies after part of the body was read; botocore rewinds the
    body (`seek(0)`) for its retry, and the object holds every byte once."""
    from botocore.exceptions import ConnectionClosedError

    store, loop = _store(moto, retries={"max_attempts": 3, "mode": "standard"})
    parts = [os.urandom(110), bytearray(os.urandom(100_000)), os.urandom(50)]
    attempts: list[int] = []

    def fail_first(request: Any, **_: Any) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            request.body.read(16384)
            request.body.read(16384)
            raise ConnectionClosedError(endpoint_url=moto.endpoint_url)

    assert store._boto3 is not None
    store._boto3.client.meta.events.register("before-send.s3.PutObject", fail_first)
    name = f"{moto.bucket}/retry-{uuid.uuid4().hex}"
    try:
        assert loop.run_until_complete(store.put_made(name, lambda: parts))
        assert len(attempts) == 2
        assert loop.run_until_complete(store.get(name)) == b"".join(bytes(p) for p in parts)
    finally:
        loop.run_until_complete(store.delete([name]))
        loop.run_until_complete(store.close())
        loop.close()
