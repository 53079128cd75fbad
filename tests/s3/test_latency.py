"""Per-request latency: every GET of a load job and every PUT of a store job is
timed on its own (`S3Tier.request_latency`), in fixed buckets whose percentiles are
exact to the bucket; on a real server, with the bytes checked."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    make_context,
    poison_slots,
    random_keys,
)
from kvtiers_s3.jobs.latency import BUCKETS, LOAD, PER_OCTAVE, STORE, RequestLatency

from tests.s3.helpers import s3_tier
from tests.s3.servers import S3Server

BLOCK = 16384
WIDTH = 2 ** (1 / PER_OCTAVE)  # a bucket's upper bound over its lower one


def test_percentiles_are_exact_to_the_bucket() -> None:
    lat = RequestLatency()
    values = [random.uniform(1e-4, 2.0) for _ in range(2000)]
    for v in values:
        lat.record(LOAD, v)
    ordered = sorted(values)
    row = lat.summary()[LOAD]
    assert row["requests"] == 2000
    for name, rank in (("p50_ms", 1000), ("p99_ms", 1980), ("max_ms", 2000)):
        exact = ordered[rank - 1] * 1e3
        assert exact / WIDTH <= row[name] <= exact * WIDTH, (name, exact, row[name])
    assert lat.summary()[STORE] == {"requests": 0, "p50_ms": None, "p99_ms": None,
                                    "max_ms": None}
    pooled = lat.values(LOAD)
    assert len(pooled) == 2000 and pooled == sorted(pooled)
    assert all(a / WIDTH <= b <= a * WIDTH for a, b in zip(ordered, pooled, strict=True))


def test_the_extremes_land_in_the_end_buckets() -> None:
    lat = RequestLatency()
    lat.record(STORE, 0.0)
    lat.record(STORE, 1e9)
    row = lat.summary()[STORE]
    assert row["requests"] == 2 and row["p50_ms"] == pytest.approx(1e-3)
    assert row["max_ms"] == pytest.approx(2 ** ((BUCKETS - 1.5) / PER_OCTAVE) * 1e-3)


@pytest.fixture
def prefix(seaweedfs: S3Server) -> Iterator[str]:
    name = f"latency-{uuid.uuid4().hex[:12]}"
    yield f"{seaweedfs.bucket}/{name}"
    seaweedfs.clear(name + "/")


@pytest.mark.parametrize("packing, loads", [("per_block", 6), ("segments", 1)])
def test_each_request_of_a_job_is_timed(seaweedfs: S3Server, prefix: str, packing: str,
                                        loads: int) -> None:
    ctx = make_context(BLOCK)
    tier = s3_tier(ctx, seaweedfs, prefix, shared=False, layout={"packing": packing})
    try:
        jobs = JobTracker(tier, 30.0)
        keys = random_keys(6)
        data = fill_slots(ctx.pool, range(6))
        assert jobs.run_store(keys, range(6)).success
        poison_slots(ctx.pool, range(10, 16))
        assert jobs.run_load(keys, range(10, 16)).success
        check_blocks(ctx.pool, list(zip(range(10, 16), data, strict=True)))
        row = tier.request_latency()
        # one PUT a block or one for the segment; one GET a block or one coalesced run
        assert row[STORE]["requests"] == (6 if packing == "per_block" else 1)
        assert row[LOAD]["requests"] == loads
        for kind in (LOAD, STORE):
            assert 0 < row[kind]["p50_ms"] <= row[kind]["p99_ms"] <= row[kind]["max_ms"]
        assert len(tier.latency.values(LOAD)) == loads
    finally:
        tier.close()
