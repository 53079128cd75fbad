"""What boto3 does for the tier that fsspec cannot: create the bucket on request
(`create_bucket: true`) and keep a lifecycle rule that expires a namespace's
objects after `ttl_s` (rounded up to whole days: S3's unit).

The rule is one per namespace (ID `kvtiers-<fingerprint>`, filtered on the
namespace prefix), merged into the bucket's other rules, re-applied at every start.
Two engines starting at once may each write the bucket's configuration; both write
the same rule, so the outcome is the same. A server without lifecycle support
(rclone, some S3 gateways) gets no rule: the tier still treats older blocks as
misses, but their objects stay until evicted.

Blocking calls with short timeouts: the tier's constructor calls them.
"""

from __future__ import annotations

import math
from typing import Any

from kvtiers_s3.client.connect import boto3_client, region_of
from kvtiers_s3.settings import S3Settings

__all__ = ["DAY_S", "ensure_bucket", "lifecycle_rule_id", "set_ttl_rule"]

DAY_S = 86400
_TIMEOUTS: dict[str, Any] = {"connect_timeout": 5, "read_timeout": 10,
                             "retries": {"total_max_attempts": 2}}


def _code(exc: Any) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", "") or "")


def ensure_bucket(settings: S3Settings, client: Any = None) -> bool:
    """Create the settings' bucket if it does not exist; True when it was created."""
    from botocore.exceptions import ClientError

    client = client or boto3_client(settings, **_TIMEOUTS)
    try:
        client.head_bucket(Bucket=settings.bucket)
        return False
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status != 404 and _code(exc) not in ("404", "NoSuchBucket", "NotFound"):
            raise
    region = region_of(settings)
    kwargs: dict[str, Any] = {"Bucket": settings.bucket}
    if region and region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        client.create_bucket(**kwargs)
    except ClientError as exc:
        if _code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
        return False  # another engine was faster
    return True


def lifecycle_rule_id(fingerprint: str) -> str:
    return f"kvtiers-{fingerprint}"


def set_ttl_rule(settings: S3Settings, ns_prefix: str, fingerprint: str, ttl_s: int,
                 client: Any = None) -> str | None:
    """Put (or replace) the namespace's expiration rule. `ns_prefix` is the
    namespace's key prefix inside the bucket. Returns None, or why no rule could
    be set (the server does not support lifecycle rules, ...), for the log."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = client or boto3_client(settings, **_TIMEOUTS)
    rule = {
        "ID": lifecycle_rule_id(fingerprint),
        "Filter": {"Prefix": ns_prefix.rstrip("/") + "/"},
        "Status": "Enabled",
        "Expiration": {"Days": max(1, math.ceil(ttl_s / DAY_S))},
    }
    try:
        try:
            current = client.get_bucket_lifecycle_configuration(Bucket=settings.bucket)
            rules = [r for r in current.get("Rules", []) if r.get("ID") != rule["ID"]]
        except ClientError as exc:
            if _code(exc) != "NoSuchLifecycleConfiguration":
                raise
            rules = []
        client.put_bucket_lifecycle_configuration(
            Bucket=settings.bucket, LifecycleConfiguration={"Rules": [*rules, rule]})
    except (ClientError, BotoCoreError) as exc:
        return settings.scrub(f"no lifecycle rule set ({_code(exc) or type(exc).__name__}): "
                              "blocks past ttl_s are misses, their objects stay until evicted")
    return None
