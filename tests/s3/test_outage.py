"""The server going away: misses within the job's limits, never a hang; the tier
recovers by itself once the server is back (SeaweedFS and rclone keep their data
across the restart; moto would come back empty)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.lookup import LookupResult
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
from kvtiers_s3.tier import S3Tier

from tests.s3.helpers import s3_tier
from tests.s3.servers import S3Server, make_server

BLOCK = 64 * 1024
TIMEOUT = 60.0
FAILURES = {FailureReason.IO, FailureReason.TIMEOUT}


@pytest.fixture(params=["seaweedfs", "rclone"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[S3Server]:
    yield from _private(request.param, tmp_path)


@pytest.fixture
def rclone_server(tmp_path: Path) -> Iterator[S3Server]:
    """rclone only: it restarts in a tenth of a second (SeaweedFS takes 1-15 s)."""
    yield from _private("rclone", tmp_path)


def _private(kind: str, tmp_path: Path) -> Iterator[S3Server]:
    s = make_server(kind, tmp_path / kind)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def _tier(server: S3Server, **extra: object) -> S3Tier:
    return s3_tier(make_context(BLOCK, 64), server, f"{server.bucket}/outage",
                   timeout_s=2, layout={"packing": "per_block"}, **extra)


def test_the_server_killed_mid_job_costs_failures_then_recovers(server: S3Server) -> None:
    tier = _tier(server)
    try:
        jobs = JobTracker(tier, TIMEOUT)
        pool = tier.ctx.pool
        kept = random_keys(8)
        data = fill_slots(pool, range(8))
        assert jobs.run_store(kept, range(8)).success

        fill_slots(pool, range(8, 40))
        job = jobs.store(random_keys(32), range(8, 40))
        server.kill()  # mid-job: some requests done, the rest refused
        result = jobs.wait([job])[0]
        assert set(result.failed.values()) <= FAILURES, result.failed
        # The scheduler side never waits for the dead server.
        assert tier.lookup(kept[0]) is LookupResult.HIT
        down = jobs.run_load(kept, range(40, 48))
        assert down.failed and set(down.failed.values()) <= FAILURES, down

        server.start()
        back = time.monotonic()
        poison_slots(pool, range(40, 48))

        def loads() -> bool:
            return jobs.run_load(kept, range(40, 48)).success

        wait_until(loads, "a load after the server came back", TIMEOUT)
        recovered = time.monotonic() - back
        check_blocks(pool, list(zip(range(40, 48), data, strict=True)))
        print(f"{server.kind}: recovered {recovered:.2f} s after the server was back")
        assert tier.stats().errors  # the failures were counted
    finally:
        tier.close()


def test_a_tier_started_while_the_server_is_away_finds_its_blocks_later(
        rclone_server: S3Server) -> None:
    server = rclone_server
    first = _tier(server)
    keys = random_keys(4)
    try:
        data = fill_slots(first.ctx.pool, range(4))
        assert JobTracker(first, TIMEOUT).run_store(keys, range(4)).success
    finally:
        first.close()
    server.kill()
    tier = _tier(server, shared=False, rescan_s=0.5)  # starts, empty: misses only
    try:
        assert tier.lookup(keys[0]) is LookupResult.MISS
        server.start()
        wait_until(lambda: resolve_lookup(tier, keys[0], TIMEOUT) is LookupResult.HIT,
                   "the blocks found once the server answers", TIMEOUT)
        jobs = JobTracker(tier, TIMEOUT)
        assert jobs.run_load(keys, range(10, 14)).success
        check_blocks(tier.ctx.pool, list(zip(range(10, 14), data, strict=True)))
    finally:
        tier.close()
