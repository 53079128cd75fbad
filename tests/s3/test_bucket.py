"""Bucket creation and the TTL lifecycle rule (boto3), on real servers."""

from __future__ import annotations

import uuid

import pytest
from kvtiers_s3.client.bucket import ensure_bucket, lifecycle_rule_id, set_ttl_rule
from kvtiers_s3.settings import S3Settings, settings_from_s3

from tests.s3.servers import S3Server

FP = "0123456789abcdef0123456789abcdef"


def _settings(server: S3Server, bucket: str) -> S3Settings:
    return settings_from_s3({"url": f"s3://{bucket}/p", "capacity_bytes": 1,
                             "create_bucket": True, "storage_options": server.storage_options()})


@pytest.mark.parametrize("kind", ["moto", "seaweedfs"])
def test_a_missing_bucket_is_created_once(request: pytest.FixtureRequest, kind: str) -> None:
    server: S3Server = request.getfixturevalue(kind)
    bucket = f"kvtiers-new-{uuid.uuid4().hex[:10]}"
    settings = _settings(server, bucket)
    client = server.client()
    try:
        assert ensure_bucket(settings) is True
        client.head_bucket(Bucket=bucket)  # raises if missing
        assert ensure_bucket(settings) is False  # there already: nothing to do
    finally:
        client.delete_bucket(Bucket=bucket)


def test_the_ttl_rule_is_merged_with_the_buckets_other_rules(moto: S3Server) -> None:
    bucket = f"kvtiers-ttl-{uuid.uuid4().hex[:10]}"
    settings = _settings(moto, bucket)
    client = moto.client()
    ensure_bucket(settings)
    try:
        other = {"ID": "someone-else", "Filter": {"Prefix": "logs/"}, "Status": "Enabled",
                 "Expiration": {"Days": 7}}
        client.put_bucket_lifecycle_configuration(
            Bucket=bucket, LifecycleConfiguration={"Rules": [other]})
        assert set_ttl_rule(settings, f"p/{FP}", FP, ttl_s=3600) is None
        assert set_ttl_rule(settings, f"p/{FP}", FP, ttl_s=3 * 86400 + 1) is None  # replaced
        rules = {r["ID"]: r for r in
                 client.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
        assert set(rules) == {"someone-else", lifecycle_rule_id(FP)}
        ours = rules[lifecycle_rule_id(FP)]
        assert ours["Expiration"]["Days"] == 4 and ours["Filter"]["Prefix"] == f"p/{FP}/"
    finally:
        client.delete_bucket(Bucket=bucket)


def test_a_server_without_lifecycle_rules_gets_a_reason_not_an_error(rclone: S3Server) -> None:
    settings = _settings(rclone, rclone.bucket)
    why = set_ttl_rule(settings, f"p/{FP}", FP, ttl_s=60)
    assert why is not None and "no lifecycle rule set" in why
