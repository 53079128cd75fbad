"""Building s3 tiers over the test servers, and looking at what they stored."""

from __future__ import annotations

from typing import Any

from kvtiers.contract.tier import TierContext
from kvtiers_s3.tier import S3Tier

from tests.s3.servers import S3Server


def s3_options(server: S3Server, prefix: str, **extra: Any) -> dict[str, Any]:
    """An s3 section for `prefix` ("bucket/name") on `server`."""
    return {"url": f"s3://{prefix}", "capacity_bytes": 64 << 20, "concurrency": 8,
            "storage_options": server.storage_options(), "rescan_s": 0, **extra}


def s3_tier(ctx: TierContext, server: S3Server, prefix: str, **extra: Any) -> S3Tier:
    return S3Tier(ctx, s3_options(server, prefix, **extra))


def listed(server: S3Server, prefix: str) -> dict[str, int]:
    """Every object under `prefix` ("bucket/name") as the server lists it: key -> size."""
    client = server.client()
    bucket, _, key_prefix = prefix.partition("/")
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                   Prefix=key_prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = int(obj["Size"])
    return out


def rewrite(server: S3Server, name: str, data: bytes) -> None:
    """Put `data` as object `name` ("bucket/key") behind the tier's back."""
    bucket, _, key = name.partition("/")
    server.client().put_object(Bucket=bucket, Key=key, Body=data)


def fetch(server: S3Server, name: str) -> bytes:
    bucket, _, key = name.partition("/")
    body: bytes = server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    return body
