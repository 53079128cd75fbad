"""Objects damaged or planted behind the tier's back, with a raw client: a damaged
object fails at most one load and is a miss from then on until it changes; one that
is provably the tier's (its checksum holds once the magic is put back) is deleted;
one that is not is never deleted but counted against `capacity_bytes`; what the
server lists under the tier's names never stays above the bound."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.tier import TierContext
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    make_context,
    poison_slots,
    random_keys,
    resolve_lookup,
    wait_until,
)
from kvtiers_s3.layout import codec, segment
from kvtiers_s3.layout.names import (
    SEGMENTS,
    block_name,
    namespace_root,
    parse_name,
    segment_name,
)
from kvtiers_s3.tier import S3Tier

from tests.s3.helpers import fetch, listed, rewrite, s3_tier
from tests.s3.servers import S3Server

BLOCK = 16384
TIMEOUT = 30.0
PER_BLOCK = {"packing": "per_block"}


@pytest.fixture(params=["moto", "seaweedfs"])
def server(request: pytest.FixtureRequest) -> S3Server:
    found: S3Server = request.getfixturevalue(request.param)
    return found


@pytest.fixture
def prefix(server: S3Server) -> Iterator[str]:
    name = f"damaged-{uuid.uuid4().hex[:12]}"
    yield f"{server.bucket}/{name}"
    server.clear(name + "/")


def _context() -> TierContext:
    # A real clock: a probe's "missing" verdict expires as it does in an engine.
    return make_context(BLOCK, 32, clock=time.monotonic)


def _flip_first_byte(server: S3Server, name: str) -> None:
    data = bytearray(fetch(server, name))
    data[0] ^= 0xFF
    rewrite(server, name, bytes(data))


def _tier_bytes(server: S3Server, prefix: str, ctx: TierContext) -> int:
    """Bytes the server lists under the names the tier makes (blocks and segments)."""
    ns = namespace_root(prefix, ctx.namespace.fingerprint)
    return sum(size for name, size in listed(server, prefix).items()
               if parse_name(ns, f"{server.bucket}/{name}") is not None)


def _load_requests(tier: S3Tier) -> int:
    return int(tier.request_latency()["load"]["requests"])


def _lookups_then_loads(tier: S3Tier, key: BlockKey, rounds: int = 8) -> list[LookupResult]:
    """Ask for `key` the way an engine would, again and again: a HIT is loaded (which
    is what costs a failed load when the answer is wrong)."""
    answers = []
    jobs = JobTracker(tier, TIMEOUT)
    for _ in range(rounds):
        answer = resolve_lookup(tier, key, TIMEOUT)
        answers.append(answer)
        if answer is LookupResult.HIT:
            jobs.run_load([key], [31])
        time.sleep(0.15)  # past the probe's cached "missing" verdict, now and then
    return answers


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "private"])
def test_a_block_object_with_its_first_byte_flipped_fails_one_load_and_is_deleted(
        server: S3Server, prefix: str, shared: bool) -> None:
    ctx = _context()
    tier = s3_tier(ctx, server, prefix, shared=shared, layout=PER_BLOCK)
    writer = None
    try:
        keys = random_keys(4)
        if shared:  # another engine stores; this one finds the blocks through its probe
            wctx = _context()
            writer = s3_tier(wctx, server, prefix, shared=True, layout=PER_BLOCK)
            data = fill_slots(wctx.pool, range(4))
            assert JobTracker(writer, TIMEOUT).run_store(keys, range(4)).success
        else:
            data = fill_slots(ctx.pool, range(4))
            assert JobTracker(tier, TIMEOUT).run_store(keys, range(4)).success
        damaged = block_name(namespace_root(prefix, ctx.namespace.fingerprint), keys[1])
        _flip_first_byte(server, damaged)
        assert [resolve_lookup(tier, k, TIMEOUT) for k in keys] == [LookupResult.HIT] * 4

        poison_slots(ctx.pool, range(10, 14))
        result = JobTracker(tier, TIMEOUT).run_load(keys, range(10, 14))
        assert result.failed == {keys[1]: FailureReason.CORRUPT}  # not a timeout
        check_blocks(ctx.pool, [(10, data[0]), (12, data[2]), (13, data[3])])
        loads = _load_requests(tier)

        # From now on a miss: no lookup answers HIT, so no load fails again.
        assert _lookups_then_loads(tier, keys[1]) == [LookupResult.MISS] * 8
        assert _load_requests(tier) == loads
        errors = tier.stats().errors
        assert errors.get("s3.load.corrupt") == 1 and "timeout" not in errors
        # Provably ours (its header checksum holds with the magic put back): deleted,
        # and what the tier counts is what the server lists.
        key = damaged.split("/", 1)[1]
        wait_until(lambda: key not in listed(server, prefix), "the damaged object deleted",
                   TIMEOUT)
        assert tier.stats().usage_bytes == _tier_bytes(server, prefix, ctx)

        # Written whole again by the tier: a HIT with the new bytes.
        fresh = fill_slots(ctx.pool, [20])
        assert JobTracker(tier, TIMEOUT).run_store([keys[1]], [20]).success
        assert resolve_lookup(tier, keys[1], TIMEOUT) is LookupResult.HIT
        poison_slots(ctx.pool, [21])
        assert JobTracker(tier, TIMEOUT).run_load([keys[1]], [21]).success
        check_blocks(ctx.pool, [(21, fresh[0])])
    finally:
        tier.close()
        if writer is not None:
            writer.close()


def test_a_segment_with_its_first_byte_flipped_is_deleted_and_the_bound_holds(
        server: S3Server, prefix: str) -> None:
    ctx = _context()
    jobs_keys = [random_keys(4) for _ in range(5)]
    seg = max(segment.segment_bytes(keys, BLOCK) for keys in jobs_keys)
    capacity = 3 * seg  # three jobs' segments (the default layout packs 16 KiB blocks)
    first = s3_tier(ctx, server, prefix, capacity_bytes=capacity)
    data = {}
    try:
        jobs = JobTracker(first, TIMEOUT)
        for keys in jobs_keys[:3]:
            filled = fill_slots(ctx.pool, range(4))
            assert jobs.run_store(keys, range(4)).success
            data.update(zip(keys, filled, strict=True))
        damaged = first.object_name(jobs_keys[1][0])
        assert damaged is not None and "/s/" in damaged
    finally:
        first.close()
    _flip_first_byte(server, damaged)

    tier = s3_tier(ctx, server, prefix, capacity_bytes=capacity)
    try:
        assert tier.startup is not None and tier.startup.bad == [damaged]
        key = damaged.split("/", 1)[1]
        wait_until(lambda: key not in listed(server, prefix), "the damaged segment deleted",
                   TIMEOUT)
        # Its blocks are misses (no load tried); the others' are intact.
        assert [resolve_lookup(tier, k, TIMEOUT) for k in jobs_keys[1]] \
            == [LookupResult.MISS] * 4
        assert _load_requests(tier) == 0
        jobs = JobTracker(tier, TIMEOUT)
        for keys in jobs_keys[3:]:  # two more jobs: one segment must be evicted for them
            filled = fill_slots(ctx.pool, range(4))
            assert jobs.run_store(keys, range(4)).success
            data.update(zip(keys, filled, strict=True))
        assert tier.stats().usage_bytes <= capacity
        wait_until(lambda: _tier_bytes(server, prefix, ctx) <= capacity,
                   "the listed bytes back under capacity_bytes", TIMEOUT)
        assert tier.stats().usage_bytes == _tier_bytes(server, prefix, ctx)

        # Stored again, whole: hits with the right bytes.
        filled = fill_slots(ctx.pool, range(4))
        assert jobs.run_store(jobs_keys[1], range(4)).success
        data.update(zip(jobs_keys[1], filled, strict=True))
        held = [k for keys in jobs_keys for k in keys
                if resolve_lookup(tier, k, TIMEOUT) is LookupResult.HIT]
        assert set(jobs_keys[1]) <= set(held) and len(held) == 12
        poison_slots(ctx.pool, range(12))
        assert jobs.run_load(held, range(12)).success
        check_blocks(ctx.pool, [(i, data[k]) for i, k in enumerate(held)])
        wait_until(lambda: _tier_bytes(server, prefix, ctx) <= capacity, "the bound kept", TIMEOUT)
    finally:
        tier.close()


def test_an_object_not_provably_ours_is_a_miss_counted_and_never_deleted(
        server: S3Server, prefix: str) -> None:
    ctx = _context()
    ns = namespace_root(prefix, ctx.namespace.fingerprint)
    (theirs,) = random_keys(1)
    record = codec.header_bytes(len(theirs)) + BLOCK
    planted = os.urandom(record)  # at one of our names, of the right size, not ours
    name = block_name(ns, theirs)
    rewrite(server, name, planted)
    # Listings every 0.3 s too: neither they nor the probes take it back in.
    tier = s3_tier(ctx, server, prefix, shared=True, layout=PER_BLOCK,
                   capacity_bytes=4 * record, rescan_s=0.3)
    try:
        assert resolve_lookup(tier, theirs, TIMEOUT) is LookupResult.HIT  # size says so
        assert JobTracker(tier, TIMEOUT).run_load([theirs], [9]).failed \
            == {theirs: FailureReason.MISSING}
        loads = _load_requests(tier)
        assert _lookups_then_loads(tier, theirs) == [LookupResult.MISS] * 8
        assert _load_requests(tier) == loads
        assert tier.quarantined() == [name]
        assert tier.stats().errors.get("s3.load.foreign") == 1

        # Counted: the tier keeps what it lists under the bound around it.
        jobs = JobTracker(tier, TIMEOUT)
        mine = random_keys(6)
        for i, k in enumerate(mine):
            fill_slots(ctx.pool, [i])
            assert jobs.run_store([k], [i]).success
        assert tier.stats().usage_bytes == 4 * record
        wait_until(lambda: _tier_bytes(server, prefix, ctx) <= 4 * record,
                   "the listed bytes under capacity_bytes", TIMEOUT)
        # Never overwritten, never deleted.
        assert jobs.run_store([theirs], [0]).failed == {theirs: FailureReason.REJECTED}
        assert fetch(server, name) == planted

        # Gone (its owner deleted it): let go, and the key can be stored.
        bucket, _, key = name.partition("/")
        server.client().delete_object(Bucket=bucket, Key=key)
        wait_until(lambda: resolve_lookup(tier, theirs, TIMEOUT) is LookupResult.MISS
                   and not tier.quarantined(), "the planted object let go", TIMEOUT)
        fresh = fill_slots(ctx.pool, [5])
        assert jobs.run_store([theirs], [5]).success
        poison_slots(ctx.pool, [6])
        assert jobs.run_load([theirs], [6]).success
        check_blocks(ctx.pool, [(6, fresh[0])])
    finally:
        tier.close()


def test_a_planted_segment_and_a_users_files_are_never_deleted(
        server: S3Server, prefix: str) -> None:
    ctx = _context()
    ns = namespace_root(prefix, ctx.namespace.fingerprint)
    seg = segment.segment_bytes(random_keys(4), BLOCK)
    capacity = 3 * seg
    planted = os.urandom(seg)  # at a segment name, no magic, no checksum: not provably ours
    at_segment = segment_name(ns, 0x5EED, 1)
    users = {f"{prefix}/notes.txt": b"the user's notes",  # beside the namespaces
             f"{ns}/b/zz/readme": os.urandom(100),  # names the tier does not make
             f"{ns}/{SEGMENTS}/00/backup.bin": os.urandom(seg)}
    rewrite(server, at_segment, planted)
    for where, body in users.items():
        rewrite(server, where, body)
    tier = s3_tier(ctx, server, prefix, capacity_bytes=capacity)
    try:
        assert tier.startup is not None and tier.startup.bad == []
        assert tier.quarantined() == [at_segment]  # counted, reported
        assert tier.stats().errors.get("s3.scan.foreign") == 1
        assert tier.stats().usage_bytes == seg
        jobs = JobTracker(tier, TIMEOUT)
        for _ in range(4):  # twice the room left: the tier evicts its own segments
            fill_slots(ctx.pool, range(4))
            assert jobs.run_store(random_keys(4), range(4)).success
        assert tier.stats().usage_bytes <= capacity
        wait_until(lambda: _tier_bytes(server, prefix, ctx) <= capacity,
                   "the bound kept, the planted segment counted", TIMEOUT)
    finally:
        tier.close()
    again = s3_tier(ctx, server, prefix, capacity_bytes=capacity)  # and after a restart
    try:
        assert again.quarantined() == [at_segment]
    finally:
        again.close()
    assert fetch(server, at_segment) == planted
    for where, body in users.items():
        assert fetch(server, where) == body, f"{where} changed"
