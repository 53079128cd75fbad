"""Objects damaged or planted at our names by a raw Mooncake client of the test's
own: a flipped bit in the block or the header and an object cut short are
`corrupt` and removed (once the master's lease allows); another program's object
and another model's block are misses, left alone. Never wrong bytes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers import FailureReason, LookupResult
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    poison_slots,
    random_keys,
    resolve_lookup,
    wait_until,
)
from kvtiers_mooncake import record

from tests.mooncake.helpers import RawClient, Tiers, context
from tests.mooncake.master import Master
from tests.mooncake.netns import NetNamespace

LEASE_MS = 300  # short, so that removals the lease holds back end within the test


@pytest.fixture
def short_lease(ns: NetNamespace, tmp_path: Path) -> Iterator[Master]:
    m = Master(ns, tmp_path, lease_ms=LEASE_MS)
    m.start()
    yield m
    m.stop_with_clients()


@pytest.fixture
def raw(ns: NetNamespace, short_lease: Master) -> Iterator[RawClient]:
    client = RawClient(ns, short_lease)
    yield client
    client.close()


@pytest.fixture
def lease_tiers(ns: NetNamespace, short_lease: Master) -> Iterator[Tiers]:
    opened = Tiers(ns, short_lease)
    yield opened
    opened.close_all()


def flip(value: bytes, at: int) -> bytes:
    damaged = bytearray(value)
    damaged[at] ^= 0x01
    return bytes(damaged)


def test_damaged_objects_are_corrupt_and_removed(lease_tiers: Tiers, raw: RawClient,
                                                 short_lease: Master) -> None:
    ctx = context()
    tier = lease_tiers.open(ctx, capacity_blocks=16)
    jobs = JobTracker(tier, 30)
    keys = random_keys(4)
    data = dict(zip(keys, fill_slots(ctx.pool, range(4)), strict=True))
    assert jobs.run_store(keys, range(4)).success
    names = [tier.names.block(k) for k in keys]
    hlen = record.header_bytes(len(keys[0]))
    value = raw.get(names[0])
    assert value[hlen:] == data[keys[0]]
    raw.replace(names[0], flip(value, hlen + 5))  # a bit of the block
    raw.replace(names[1], flip(raw.get(names[1]), 20))  # a bit of the header
    raw.replace(names[2], raw.get(names[2])[: hlen + ctx.block_bytes // 3])  # cut short
    poison_slots(ctx.pool, range(8, 12))
    result = jobs.run_load(keys, range(8, 12))
    assert result.failed == {k: FailureReason.CORRUPT for k in keys[:3]}, result
    check_blocks(ctx.pool, [(11, data[keys[3]])])
    # removed once the lease our own read took has run out (watched through the
    # master's listing: an existence check would take a lease itself); usage follows
    wait_until(lambda: not set(names[:3]) & set(short_lease.names()),
               "damaged objects removed", 30)
    wait_until(lambda: tier.stats().usage_bytes == ctx.block_bytes, "usage of one block", 30)
    for key in keys[:3]:
        assert resolve_lookup(tier, key, 30) is LookupResult.MISS
    # stored again, they load whole
    for slot, key in enumerate(keys[:3]):
        ctx.pool.block(slot)[:] = data[key]
    assert jobs.run_store(keys[:3], range(3)).success
    poison_slots(ctx.pool, range(8, 11))
    assert jobs.run_load(keys[:3], range(8, 11)).success
    check_blocks(ctx.pool, [(8 + i, data[k]) for i, k in enumerate(keys[:3])])


def test_objects_not_ours_are_misses_left_alone(lease_tiers: Tiers, raw: RawClient) -> None:
    ctx = context()
    tier = lease_tiers.open(ctx, capacity_blocks=16)
    other = lease_tiers.open(context("another/model"), capacity_blocks=16)
    jobs = JobTracker(tier, 30)
    keys = random_keys(3)
    data = dict(zip(keys, fill_slots(ctx.pool, range(3)), strict=True))
    assert jobs.run_store(keys, range(3)).success
    # another program's bytes in place of one of ours, and at a name we never used
    planted = os.urandom(ctx.block_bytes + 200)
    raw.replace(tier.names.block(keys[0]), planted)
    stranger = random_keys(1)[0]
    raw.replace(tier.names.block(stranger), planted)
    # another model's block for the same key, copied to our name
    fill_slots(other.ctx.pool, [0])
    assert JobTracker(other, 30).run_store([keys[1]], [0]).success
    raw.replace(tier.names.block(keys[1]), raw.get(other.names.block(keys[1])))
    assert resolve_lookup(tier, stranger, 30) is LookupResult.HIT  # it exists...
    poison_slots(ctx.pool, range(8, 12))
    before = [bytes(ctx.pool.block(s)) for s in range(8, 12)]
    result = jobs.run_load([*keys, stranger], range(8, 12))
    assert result.failed == {keys[0]: FailureReason.MISSING, keys[1]: FailureReason.MISSING,
                             stranger: FailureReason.MISSING}, result  # ...but not ours
    check_blocks(ctx.pool, [(10, data[keys[2]])])
    for slot in (8, 9, 11):  # whatever landed there, no success was claimed for it
        assert bytes(ctx.pool.block(slot)) != data.get(keys[0])
    assert before[2] != bytes(ctx.pool.block(10))
    assert raw.get(tier.names.block(keys[0])) == planted  # left alone
    assert raw.get(tier.names.block(stranger)) == planted
    assert raw.get(tier.names.block(keys[1])) == raw.get(other.names.block(keys[1]))
    assert tier.stats().usage_bytes == ctx.block_bytes  # only the block still ours
    assert tier.stats().errors  # counted, by kind
