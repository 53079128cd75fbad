"""`kvtiers inspect`, `kvtiers verify` and `kvtiers snapshot` on the s3 tier, as a user
runs them (the CLI in a subprocess) against a real object store: what inspect lists
matches a raw listing of the bucket and changes nothing; verify finds a flipped
byte and `--repair` deletes exactly that object (its block misses afterwards, the
others load byte for byte), while an object that is not provably the tier's is
reported and left alone; a snapshot of an s3 tier loads back into another prefix
with the right bytes. Both layouts (packed segments, per-block objects), shared and
not."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.tier import TierContext
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    make_context,
    make_namespace,
    poison_slots,
    random_keys,
    resolve_lookup,
)
from kvtiers_s3.layout import codec
from kvtiers_s3.layout.names import block_name, namespace_root
from kvtiers_s3.tier import S3Tier

from tests.clirun import run_kvtiers
from tests.s3.conftest import REPO, cli_env
from tests.s3.helpers import fetch, rewrite, s3_options
from tests.s3.servers import S3Server

BLOCK = 16384
TIMEOUT = 60.0
RECORD = codec.header_bytes(len(random_keys(1)[0])) + BLOCK  # a block object

#: each packing and each sharing mode once (the two axes act on different code: the
#: packing on what an object holds, sharing on how a listing is taken in)
LAYOUTS = [pytest.param("segments", True, id="segments-shared"),
           pytest.param("per_block", False, id="per_block-private")]


@pytest.fixture
def prefix(seaweedfs: S3Server) -> Iterator[str]:
    name = f"ops-{uuid.uuid4().hex[:12]}"
    yield f"{seaweedfs.bucket}/{name}"
    seaweedfs.clear(name + "/")


def context(model: str) -> TierContext:
    return make_context(BLOCK, 64, namespace=make_namespace(model, BLOCK))


def section(server: S3Server, prefix: str, packing: str, shared: bool) -> dict[str, Any]:
    return s3_options(server, prefix, layout={"packing": packing}, shared=shared,
                      capacity_bytes=256 * RECORD)


def config(path: Path, tier: dict[str, Any], model: str = "model-a") -> str:
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "model": model,
                                "secondary_tiers": [{"type": "s3", **tier}]}))
    return str(path)


def kvtiers(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_kvtiers(args, cwd=REPO, env=cli_env(tmp_path), timeout=300)


def run_json(tmp_path: Path, *args: str, rc: int = 0) -> dict[str, Any]:
    done = kvtiers(tmp_path, *args, "--json")
    assert done.returncode == rc, done.stdout + done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def raw(server: S3Server, prefix: str) -> dict[str, tuple[int, str]]:
    """Every object under `prefix` as the server lists it - but the recency manifest,
    which a tier opened by verify rewrites at close as any engine does: key ->
    (size, ETag)."""
    client = server.client()
    bucket, _, key_prefix = prefix.partition("/")
    out: dict[str, tuple[int, str]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                   Prefix=key_prefix + "/"):
        for obj in page.get("Contents", []):
            if not obj["Key"].endswith("/recency.json"):
                out[obj["Key"]] = (int(obj["Size"]), obj["ETag"])
    return out


def store(tier: S3Tier, keys: list[BlockKey], jobs: int = 2) -> dict[BlockKey, bytes]:
    """`keys` stored in `jobs` store jobs (segments: one per job); their bytes."""
    tracker = JobTracker(tier, TIMEOUT)
    data: dict[BlockKey, bytes] = {}
    per = -(-len(keys) // jobs)
    for at in range(0, len(keys), per):
        part = keys[at:at + per]
        data.update(zip(part, fill_slots(tier.ctx.pool, range(len(part))), strict=True))
        assert tracker.run_store(part, range(len(part))).success
    return data


def load_and_check(tier: S3Tier, expected: dict[BlockKey, bytes], misses: set[BlockKey]) -> None:
    """Every key of `expected` but `misses` is a hit that loads its bytes; `misses`
    are misses."""
    tracker = JobTracker(tier, TIMEOUT)
    for key in misses:
        assert resolve_lookup(tier, key) is LookupResult.MISS
    hits = [k for k in expected if k not in misses]
    for key in hits:
        assert resolve_lookup(tier, key) is LookupResult.HIT
    for at in range(0, len(hits), 32):
        part = hits[at:at + 32]
        poison_slots(tier.ctx.pool, range(len(part)))
        assert tracker.run_load(part, range(len(part))).success
        check_blocks(tier.ctx.pool, [(i, expected[k]) for i, k in enumerate(part)])


def of(doc: dict[str, Any], fp: str) -> dict[str, Any]:
    (tier,) = doc["tiers"]
    (ns,) = [n for n in tier["namespaces"] if n["namespace"] == fp]
    out: dict[str, Any] = ns
    return out


@pytest.mark.parametrize(("packing", "shared"), LAYOUTS)
def test_inspect_and_verify_find_what_the_bucket_holds_and_repair_only_ours(
        tmp_path: Path, seaweedfs: S3Server, prefix: str, packing: str, shared: bool) -> None:
    options = section(seaweedfs, prefix, packing, shared)
    a_ctx, b_ctx = context("model-a"), context("model-b")
    keys = random_keys(40)
    a = S3Tier(a_ctx, options)
    try:
        data = store(a, keys)
        flipped = keys[7]
        name = a.object_name(flipped)
        obj = a.held_object(flipped)
        assert name is not None and obj is not None
        at = obj.members[flipped].offset + codec.header_bytes(len(flipped)) + 1000
        same_object = {k for k in keys if a.object_name(k) == name}
    finally:
        a.close()
    b = S3Tier(b_ctx, options)
    try:
        store(b, keys[:5], jobs=1)
    finally:
        b.close()
    fp_a, fp_b = a_ctx.namespace.fingerprint, b_ctx.namespace.fingerprint
    assert packing == "per_block" or len(same_object) == 20, "a job is one segment"
    cfg = config(tmp_path / "c.json", options)

    # inspect: counts and bytes as a raw listing says, and nothing changed
    before = raw(seaweedfs, prefix)
    root = prefix.split("/", 1)[1]

    def under(fp: str) -> int:
        return sum(size for k, (size, _) in before.items()
                   if k.startswith(f"{root}/{fp}/b/") or k.startswith(f"{root}/{fp}/s/"))

    doc = run_json(tmp_path, "inspect", cfg)
    assert raw(seaweedfs, prefix) == before, "inspect changed the bucket"
    ours, other = of(doc, fp_a), of(doc, fp_b)
    assert ours["ours"] and not other["ours"]
    assert (ours["model"], other["model"]) == ("model-a", "model-b")
    assert ours["geometry"][0]["head_size"] == BLOCK // 2
    assert (ours["blocks"], other["blocks"]) == (40, 5)
    assert ours["committed_bytes"] == under(fp_a) and other["committed_bytes"] == under(fp_b)
    assert ours["capacity_bytes"] == 256 * RECORD and ours["unreadable_objects"] == 0
    assert ours["usage_bytes"] == ours["committed_bytes"]
    assert ours["oldest"] is not None and ours["location"] == f"s3://{prefix}/{fp_a}"
    assert run_json(tmp_path, "verify", cfg)["ok"]

    # damage: one flipped byte of a block; another program's object at a block's name
    # (no magic, a block object's size) and one at a name the tier never makes
    damaged = bytearray(fetch(seaweedfs, name))
    damaged[at] ^= 0x40
    rewrite(seaweedfs, name, bytes(damaged))
    planted_key = random_keys(1)[0]
    planted = block_name(namespace_root(prefix, fp_a), planted_key)
    planted_bytes = b"NOTKVTS3" + os.urandom(RECORD - 8)
    rewrite(seaweedfs, planted, planted_bytes)
    stranger = f"{prefix}/{fp_a}/notes/readme.txt"
    stranger_bytes = os.urandom(777)
    rewrite(seaweedfs, stranger, stranger_bytes)
    before = raw(seaweedfs, prefix)

    doc = run_json(tmp_path, "inspect", cfg)
    ours = of(doc, fp_a)
    assert ours["blocks"] == 41  # the planted object has a block's name and size
    assert ours["unreadable_objects"] == 1 and ours["unreadable_bytes"] == 777
    assert ours["usage_bytes"] == ours["committed_bytes"] + 777

    doc = run_json(tmp_path, "verify", cfg, rc=1)
    assert raw(seaweedfs, prefix) == before, "verify without --repair deleted something"
    ns = of(doc, fp_a)
    assert ns["checked"] == 41 and of(doc, fp_b)["ok"]
    bad = {b["key"]: b for b in ns["bad"]}
    assert set(bad) == {flipped.hex(), planted_key.hex()}
    assert bad[flipped.hex()]["reason"] == "checksum"
    assert bad[planted_key.hex()]["reason"] == "header"
    assert "left alone" in bad[planted_key.hex()]["detail"]
    assert not any(b["removed"] for b in ns["bad"])
    assert any("notes/readme.txt" in n for n in ns["notes"])

    done = kvtiers(tmp_path, "verify", cfg, "--repair")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "(removed)" in done.stdout and "readme.txt" in done.stdout
    after = raw(seaweedfs, prefix)
    gone = {k for k in before if k not in after}
    assert gone == {name.split("/", 1)[1]}, "repair deleted exactly the damaged object"
    assert fetch(seaweedfs, planted) == planted_bytes
    assert fetch(seaweedfs, stranger) == stranger_bytes

    doc = run_json(tmp_path, "verify", cfg, rc=1)  # the planted object stays reported
    ns = of(doc, fp_a)
    assert [(b["key"], b["removed"]) for b in ns["bad"]] == [(planted_key.hex(), False)]
    assert ns["checked"] == 41 - len(same_object)
    doc = run_json(tmp_path, "inspect", cfg)
    assert of(doc, fp_a)["blocks"] == 41 - len(same_object)

    a = S3Tier(context("model-a"), options)
    try:
        load_and_check(a, data, misses=same_object)
    finally:
        a.close()


def test_a_segment_with_a_damaged_magic_is_counted_then_deleted(
        tmp_path: Path, seaweedfs: S3Server, prefix: str) -> None:
    """The issue's leak: a segment whose first byte is flipped takes room under the
    prefix; inspect counts it as unreadable, verify reports it deleted (the tier
    proves it its own)."""
    options = section(seaweedfs, prefix, "segments", True)
    ctx = context("model-a")
    keys = random_keys(20)
    tier = S3Tier(ctx, options)
    try:
        data = store(tier, keys)
        name = tier.object_name(keys[0])
        assert name is not None
        lost = {k for k in keys if tier.object_name(k) == name}
    finally:
        tier.close()
    damaged = bytearray(fetch(seaweedfs, name))
    damaged[0] ^= 0xFF
    rewrite(seaweedfs, name, bytes(damaged))
    cfg = config(tmp_path / "c.json", options)
    fp = ctx.namespace.fingerprint

    ns = of(run_json(tmp_path, "inspect", cfg), fp)
    assert ns["blocks"] == 20 - len(lost)
    assert (ns["unreadable_objects"], ns["unreadable_bytes"]) == (1, len(damaged))
    ns = of(run_json(tmp_path, "verify", cfg, rc=1), fp)
    (bad,) = ns["bad"]
    assert bad["key"] is None and bad["removed"] and name in bad["location"]
    assert name.split("/", 1)[1] not in raw(seaweedfs, prefix)
    ns = of(run_json(tmp_path, "inspect", cfg), fp)
    assert ns["unreadable_objects"] == 0 and ns["blocks"] == 20 - len(lost)
    tier = S3Tier(context("model-a"), options)
    try:
        load_and_check(tier, data, misses=lost)
    finally:
        tier.close()


@pytest.mark.parametrize("packing", ["segments", "per_block"])
def test_a_snapshot_of_an_s3_tier_loads_back_with_its_bytes(
        tmp_path: Path, seaweedfs: S3Server, prefix: str, packing: str) -> None:
    source = section(seaweedfs, prefix, packing, True)
    target = section(seaweedfs, prefix + "-copy", packing, True)
    keys = random_keys(30)
    tier = S3Tier(context("model-a"), source)
    try:
        data = store(tier, keys, jobs=3)  # the last job's blocks are the most recent
    finally:
        tier.close()
    snap, hot = str(tmp_path / "warm.zarr"), str(tmp_path / "hot.zarr")
    cfg_a, cfg_b = config(tmp_path / "a.json", source), config(tmp_path / "b.json", target)
    try:
        saved = run_json(tmp_path, "snapshot", "save", cfg_a, snap)
        assert saved["blocks"] == 30 and saved["failed"] == {}
        assert saved["hottest_by"] == "recency"
        saved = run_json(tmp_path, "snapshot", "save", cfg_a, hot, "--hottest", "10")
        assert saved["blocks"] == 10
        loaded = run_json(tmp_path, "snapshot", "load", cfg_b, hot)
        assert loaded["blocks"] == 10 and loaded["failed"] == {} and loaded["bad"] == []
        copy = S3Tier(context("model-a"), target)
        try:
            load_and_check(copy, data, misses=set(keys[:20]))
        finally:
            copy.close()
        loaded = run_json(tmp_path, "snapshot", "load", cfg_b, snap)
        assert loaded["blocks"] == 30 and loaded["failed"] == {} and loaded["bad"] == []
        copy = S3Tier(context("model-a"), target)
        try:
            load_and_check(copy, data, misses=set())
        finally:
            copy.close()
    finally:
        seaweedfs.clear(prefix.split("/", 1)[1] + "-copy/")
