"""Values planted at the tier's names with a raw client of the test's own: another
program's value, another model's block, a value of another type, a damaged header.
None is ever served; ours and damaged is deleted, anything else is left alone - at
a load and at a start-up scan alike."""

from __future__ import annotations

import os

from kvtiers import FailureReason, LookupResult
from kvtiers.testing import JobTracker, check_blocks, fill_slots, poison_slots, random_keys
from kvtiers_redis import record

from tests.redis.helpers import BLOCK, Tiers, context
from tests.redis.server import RedisServer

OTHER_FP = "0123456789abcdef0123456789abcdef"


def _plants(key: bytes, ours: bytes) -> dict[str, bytes]:
    """Values for `key`'s name: what each is, and its bytes (`ours`: our stored value)."""
    damaged_header = bytearray(ours)
    damaged_header[30] ^= 0xFF  # inside the fingerprint: the header checksum catches it
    return {
        "foreign": b"not-kvtiers" + os.urandom(BLOCK),
        "other-namespace": record.encode(OTHER_FP, key, os.urandom(BLOCK)),
        "other-key": record.encode(ours[12:44].decode(), os.urandom(len(key)),
                                   os.urandom(BLOCK)),
        "damaged-header": bytes(damaged_header),
        "past-the-end": ours + os.urandom(16),
    }


LEFT_ALONE = {"foreign", "other-namespace"}


def test_planted_values_are_never_served(server: RedisServer, tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=16)
    jobs = JobTracker(tier)
    keys = random_keys(7)
    data = fill_slots(ctx.pool, range(7))
    assert jobs.run_store(keys, range(7)).success
    raw = server.client()
    names = [tier.names.block(k) for k in keys]
    ours = raw.get(names[0])
    assert isinstance(ours, bytes) and ours.endswith(data[0])
    plants = _plants(keys[0], ours)
    planted = dict(zip(plants, keys[:5], strict=True))
    for what, key in planted.items():
        raw.set(tier.names.block(key), plants[what])
    raw.delete(names[5])
    raw.rpush(names[5], b"a list, not a string")  # another type at a block's name

    poison_slots(ctx.pool, range(8, 15))
    result = jobs.run_load(keys, range(8, 15))
    want = {key: FailureReason.MISSING if what in LEFT_ALONE else FailureReason.CORRUPT
            for what, key in planted.items()}
    want[keys[5]] = FailureReason.MISSING
    assert result.failed == want, result
    check_blocks(ctx.pool, [(14, data[6])], "the one intact block")
    assert [tier.lookup(k) for k in keys[:6]] == [LookupResult.MISS] * 6
    for what, key in planted.items():
        left = raw.get(tier.names.block(key))
        if what in LEFT_ALONE:
            assert left == plants[what], f"the {what} value was changed"
        else:
            assert left is None, f"the damaged ({what}) value was kept"
    assert raw.type(names[5]) == b"list"
    assert tier.stats().usage_bytes == BLOCK
    raw.close()


def test_planted_values_are_sorted_out_at_start_up(server: RedisServer, tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=16)
    keys = random_keys(7)
    data = fill_slots(ctx.pool, range(7))
    assert JobTracker(tier).run_store(keys, range(7)).success
    tier.close()
    raw = server.client()
    ours = raw.get(tier.names.block(keys[0]))
    assert isinstance(ours, bytes)
    plants = _plants(keys[0], ours)
    planted = dict(zip(plants, keys[:5], strict=True))
    for what, key in planted.items():
        raw.set(tier.names.block(key), plants[what])
    raw.delete(tier.names.block(keys[5]))
    raw.rpush(tier.names.block(keys[5]), b"a list")
    raw.set(tier.names.blocks + b"not-hex", b"x")  # a name that is no key of ours

    ctx2 = context()
    tier = tiers.open(ctx2, capacity_blocks=16)
    assert [tier.lookup(k) for k in keys] == [LookupResult.MISS] * 6 + [LookupResult.HIT]
    assert tier.stats().usage_bytes == BLOCK
    poison_slots(ctx2.pool, [8])
    assert JobTracker(tier).run_load(keys[6:], [8]).success
    check_blocks(ctx2.pool, [(8, data[6])])
    tier.close()  # its background deletes are done once it is closed
    for what, key in planted.items():
        left = raw.get(tier.names.block(key))
        assert left == (plants[what] if what in LEFT_ALONE else None), what
    assert raw.type(tier.names.block(keys[5])) == b"list"
    assert raw.get(tier.names.blocks + b"not-hex") == b"x"
    raw.close()
