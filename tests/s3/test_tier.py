"""The s3 tier's own behaviour beyond the conformance suite: vLLM's obj form, objects
damaged or planted behind its back, packed segments, TTL, bucket creation."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
from kvtiers.errors import ConfigError
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    make_context,
    make_namespace,
    poison_slots,
    random_keys,
    resolve_lookup,
    wait_until,
)
from kvtiers_s3.layout.names import block_name, namespace_root
from kvtiers_s3.tier import ObjTier, S3Tier

from tests.s3.helpers import fetch, listed, rewrite, s3_tier
from tests.s3.servers import S3Server

BLOCK = 16384
TIMEOUT = 30.0


@pytest.fixture
def prefix(seaweedfs: S3Server) -> Iterator[str]:
    name = f"tier-{uuid.uuid4().hex[:12]}"
    yield f"{seaweedfs.bucket}/{name}"
    seaweedfs.clear(name + "/")


def _round_trip(tier: S3Tier, n: int = 4) -> None:
    jobs = JobTracker(tier, TIMEOUT)
    keys = random_keys(n)
    data = fill_slots(tier.ctx.pool, range(n))
    assert jobs.run_store(keys, range(n)).success
    poison_slots(tier.ctx.pool, range(20, 20 + n))
    assert jobs.run_load(keys, range(20, 20 + n)).success
    check_blocks(tier.ctx.pool, list(zip(range(20, 20 + n), data, strict=True)))


def test_vllms_obj_options_store_and_load(seaweedfs: S3Server, prefix: str) -> None:
    ctx = make_context(BLOCK)
    store = {"bucket": seaweedfs.bucket, "endpoint_override": seaweedfs.endpoint_url,
             "access_key": seaweedfs.admin.key, "secret_key": seaweedfs.admin.secret}
    tier = ObjTier(ctx, {"store_config": store, "prefix": prefix.split("/", 1)[1],
                         "concurrency": 4, "capacity_bytes": 1 << 24})
    try:
        assert tier.settings.concurrency == 4 and tier.settings.url == f"s3://{prefix}"
        _round_trip(tier)
        assert listed(seaweedfs, prefix)  # the objects are where the prefix says
    finally:
        tier.close()


def test_a_block_changed_behind_the_tiers_back_is_corrupt_then_gone(
        seaweedfs: S3Server, prefix: str) -> None:
    ctx = make_context(BLOCK)
    tier = s3_tier(ctx, seaweedfs, prefix, shared=False, layout={"packing": "per_block"})
    try:
        jobs = JobTracker(tier, TIMEOUT)
        keys = random_keys(3)
        fill_slots(ctx.pool, range(3))
        assert jobs.run_store(keys, range(3)).success
        name = tier.object_name(keys[1])
        assert name is not None
        data = bytearray(fetch(seaweedfs, name))
        data[-100] ^= 0x01
        rewrite(seaweedfs, name, bytes(data))
        result = jobs.run_load(keys, range(10, 13))
        assert result.failed == {keys[1]: FailureReason.CORRUPT}
        assert tier.lookup(keys[1]) is LookupResult.MISS
        key = name.split("/", 1)[1]
        wait_until(lambda: key not in listed(seaweedfs, prefix), "corrupt object deleted", TIMEOUT)
        assert tier.stats().errors.get("corrupt") == 1
    finally:
        tier.close()


def test_a_cut_segment_loses_the_records_after_the_cut_only(
        seaweedfs: S3Server, prefix: str) -> None:
    ctx = make_context(BLOCK)
    tier = s3_tier(ctx, seaweedfs, prefix, shared=False, layout={"packing": "segments"})
    try:
        jobs = JobTracker(tier, TIMEOUT)
        keys = random_keys(6)
        data = fill_slots(ctx.pool, range(6))
        assert jobs.run_store(keys, range(6)).success
        names = {tier.object_name(k) for k in keys}
        assert len(names) == 1, "one job of small blocks is one segment"
        (name,) = names
        assert name is not None
        obj = tier.held_object(keys[3])
        assert obj is not None
        cut = obj.members[keys[3]].offset + 50
        rewrite(seaweedfs, name, fetch(seaweedfs, name)[:cut])
        poison_slots(ctx.pool, range(10, 16))
        result = jobs.run_load(keys, range(10, 16))
        assert result.ok == keys[:3]
        assert result.failed == {k: FailureReason.CORRUPT for k in keys[3:]}
        check_blocks(ctx.pool, list(zip(range(10, 13), data[:3], strict=True)))
        assert name.split("/", 1)[1] in listed(seaweedfs, prefix)  # 3 live records in it
    finally:
        tier.close()


def test_another_namespaces_block_under_our_name_is_a_miss_left_alone(
        seaweedfs: S3Server, prefix: str) -> None:
    ctx_a = make_context(BLOCK, namespace=make_namespace("model-a", BLOCK))
    ctx_b = make_context(BLOCK, namespace=make_namespace("model-b", BLOCK))
    a = s3_tier(ctx_a, seaweedfs, prefix, shared=False, layout={"packing": "per_block"})
    (key,) = random_keys(1)
    try:
        fill_slots(ctx_a.pool, [0])
        assert JobTracker(a, TIMEOUT).run_store([key], [0]).success
        theirs = a.object_name(key)
        assert theirs is not None
    finally:
        a.close()
    ours = block_name(namespace_root(prefix, ctx_b.namespace.fingerprint), key)
    rewrite(seaweedfs, ours, fetch(seaweedfs, theirs))  # right size, wrong namespace
    b = s3_tier(ctx_b, seaweedfs, prefix, shared=False, layout={"packing": "per_block"})
    try:
        assert b.lookup(key) is LookupResult.HIT  # the listing cannot tell
        result = JobTracker(b, TIMEOUT).run_load([key], [5])
        assert result.failed == {key: FailureReason.MISSING}
        assert b.lookup(key) is LookupResult.MISS
        assert ours.split("/", 1)[1] in listed(seaweedfs, prefix), "someone else's: kept"
    finally:
        b.close()


def test_broken_objects_of_ours_are_deleted_at_start(seaweedfs: S3Server, prefix: str) -> None:
    ctx = make_context(BLOCK)
    ns = namespace_root(prefix, ctx.namespace.fingerprint)
    keys = random_keys(2)
    writer = s3_tier(ctx, seaweedfs, prefix, layout={"packing": "per_block"})
    try:
        fill_slots(ctx.pool, range(2))
        assert JobTracker(writer, TIMEOUT).run_store(keys, range(2)).success
    finally:
        writer.close()
    short = block_name(ns, keys[0])  # ours, cut: its header says whose it is
    rewrite(seaweedfs, short, fetch(seaweedfs, short)[:BLOCK // 2])
    theirs = block_name(ns, keys[1])  # not a record, at one of our names: not provably ours
    rewrite(seaweedfs, theirs, os.urandom(BLOCK // 2))
    other = f"{ns}/notes.txt"  # not a name the tier makes: never touched
    rewrite(seaweedfs, other, b"hello")
    tier = s3_tier(ctx, seaweedfs, prefix)
    try:
        assert tier.startup is not None and tier.startup.bad == [short]
        assert tier.quarantined() == [theirs]  # counted, kept
        keys_listed = listed(seaweedfs, prefix)
        wait_until(lambda: short.split("/", 1)[1] not in listed(seaweedfs, prefix),
                   "the broken object deleted", TIMEOUT)
        assert other.split("/", 1)[1] in keys_listed
        assert theirs.split("/", 1)[1] in listed(seaweedfs, prefix)
    finally:
        tier.close()


def test_segments_are_evicted_whole_and_the_bound_counts_their_bytes(
        seaweedfs: S3Server, prefix: str) -> None:
    ctx = make_context(BLOCK)
    probe = s3_tier(ctx, seaweedfs, prefix + "-size", layout={"packing": "segments"})
    try:
        jobs = JobTracker(probe, TIMEOUT)
        fill_slots(ctx.pool, range(4))
        assert jobs.run_store(random_keys(4), range(4)).success
        one = probe.stats().usage_bytes  # one segment of 4 blocks
    finally:
        probe.close()
        seaweedfs.clear(prefix.split("/", 1)[1] + "-size/")
    tier = s3_tier(ctx, seaweedfs, prefix, layout={"packing": "segments"},
                   capacity_bytes=2 * one)
    try:
        jobs = JobTracker(tier, TIMEOUT)
        batches = [random_keys(4) for _ in range(3)]
        for keys in batches:
            fill_slots(ctx.pool, range(4))
            assert jobs.run_store(keys, range(4)).success
        assert tier.stats().usage_bytes == 2 * one and tier.stats().evictions == 1
        held = [resolve_lookup(tier, k, TIMEOUT) for keys in batches for k in keys]
        assert held == [LookupResult.MISS] * 4 + [LookupResult.HIT] * 8
        def segments() -> int:
            return sum(1 for name in listed(seaweedfs, prefix) if "/s/" in name)

        wait_until(lambda: segments() == 2, "the evicted segment deleted", TIMEOUT)
    finally:
        tier.close()


def test_blocks_past_their_ttl_are_misses(seaweedfs: S3Server, prefix: str) -> None:
    ctx = make_context(BLOCK)
    tier = s3_tier(ctx, seaweedfs, prefix, ttl_s=3600, shared=False)
    try:
        jobs = JobTracker(tier, TIMEOUT)
        keys = random_keys(2)
        fill_slots(ctx.pool, range(2))
        assert jobs.run_store(keys, range(2)).success
        assert tier.lookup(keys[0]) is LookupResult.HIT
        later = time.time() + 7200
        tier.wall_clock = lambda: later
        assert tier.lookup(keys[0]) is LookupResult.MISS
    finally:
        tier.close()


def test_a_missing_bucket_is_created_on_request_or_refused(moto: S3Server) -> None:
    bucket = f"kvtiers-tier-{uuid.uuid4().hex[:8]}"
    ctx = make_context(BLOCK)
    with pytest.raises(ConfigError) as info:
        s3_tier(ctx, moto, f"{bucket}/p")
    assert "$.url" in str(info.value) and "does not exist" in str(info.value)
    tier = s3_tier(ctx, moto, f"{bucket}/p", create_bucket=True)
    try:
        _round_trip(tier)
    finally:
        tier.close()
        moto.clear_bucket(bucket)


def test_a_private_tier_never_probes(seaweedfs: S3Server, prefix: str) -> None:
    tier = s3_tier(make_context(BLOCK), seaweedfs, prefix, shared=False)
    try:
        assert tier.shared is False
        assert tier.lookup(random_keys(1)[0]) is LookupResult.MISS  # at once, no RETRY
    finally:
        tier.close()
