"""A store that failed while the server was frozen (SIGSTOP) must not leave its
object behind uncounted once the server runs again (SIGCONT): its request was in
the server's buffers and lands late. The tier takes it back (deletes it), so what
the prefix lists stays exactly what the tier counts, without any listing
(`rescan_s: 0`), and a later store of the same keys is kept, not taken back."""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    make_context,
    poison_slots,
    random_keys,
    wait_until,
)
from kvtiers_s3.layout.names import parse_name
from kvtiers_s3.tier import S3Tier

from tests.s3.helpers import listed, s3_tier
from tests.s3.servers import S3Server, make_server

BLOCK = 64 * 1024
TIMEOUT = 60.0
FAILURES = {FailureReason.IO, FailureReason.TIMEOUT}
#: how long the listing must stay equal to the usage (late requests land at once)
SETTLED_S = 1.5
#: each server and each packing once: the two axes act on different code (the server
#: decides when a request it took before the freeze lands, the packing what the tier
#: stored and takes back)
CASES = [pytest.param("rclone", "per_block", id="rclone-per_block"),
         pytest.param("seaweedfs", "segments", id="seaweedfs-segments")]


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[S3Server]:
    """A server of the test's own (`request.param`: its kind), to freeze."""
    s = make_server(request.param, tmp_path / request.param)
    try:
        s.start()
        yield s
    finally:
        if s.proc is not None and s.proc.poll() is None:
            os.killpg(s.proc.pid, signal.SIGCONT)  # never leave it frozen
        s.stop()


def _signal(server: S3Server, sig: signal.Signals) -> None:
    assert server.proc is not None and server.proc.poll() is None
    os.killpg(server.proc.pid, sig)


def _held_bytes_listed(server: S3Server, tier: S3Tier, prefix: str) -> int:
    """The bytes of every object under the prefix at a name the tier makes (block
    objects and segments), as the server lists them."""
    bucket = prefix.partition("/")[0]
    return sum(size for key, size in listed(server, prefix).items()
               if parse_name(tier.ns_root, f"{bucket}/{key}") is not None)


@pytest.mark.parametrize(("server", "packing"), CASES, indirect=["server"])
def test_a_store_failed_while_the_server_was_frozen_leaves_nothing_uncounted(
        server: S3Server, packing: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    prefix = f"{server.bucket}/late"
    capacity = 24 * (BLOCK + 4096)
    tier = s3_tier(make_context(BLOCK, 64), server, prefix, timeout_s=1, shared=False,
                   capacity_bytes=capacity, layout={"packing": packing})
    try:
        jobs = JobTracker(tier, TIMEOUT)
        pool, clock = tier.ctx.pool, tier.ctx.clock
        kept = random_keys(4)
        kept_data = fill_slots(pool, range(4))
        assert jobs.run_store(kept, range(4)).success

        late = random_keys(8)
        fill_slots(pool, range(8, 16))
        _signal(server, signal.SIGSTOP)
        try:
            result = jobs.run_store(late, range(8, 16), deadline=clock() + 0.5)
        finally:
            _signal(server, signal.SIGCONT)
        assert result.failed and set(result.failed.values()) <= FAILURES, result
        assert not result.ok, result
        # Every request's end was awaited: none is left unretrieved (asyncio logs
        # such a future as it is collected).
        gc.collect()
        assert not [r for r in caplog.records if r.name == "asyncio"
                    and "never retrieved" in r.getMessage()], "a request's future left unread"

        def exact() -> bool:
            return _held_bytes_listed(server, tier, prefix) == tier.stats().usage_bytes

        # The late requests land once the server runs (any moment after SIGCONT);
        # the tier takes them back. Exact now is not enough: exact and staying so.
        since: list[float] = []

        def settled() -> bool:
            if not exact():
                since.clear()
                return False
            since[:] = since or [time.monotonic()]
            return time.monotonic() - since[0] >= SETTLED_S

        wait_until(settled, "the listing to match the tier's usage, and stay so", TIMEOUT)
        assert tier.stats().usage_bytes <= capacity

        # The same keys stored again are kept (no late clean-up takes them) and
        # load back as stored.
        again = fill_slots(pool, range(8, 16))
        assert jobs.run_store(late, range(8, 16)).success
        assert exact()
        poison_slots(pool, range(20, 32))
        assert jobs.run_load([*kept, *late], range(20, 32)).success
        check_blocks(pool, list(zip(range(20, 32), [*kept_data, *again], strict=True)))
        assert _held_bytes_listed(server, tier, prefix) == tier.stats().usage_bytes
        assert tier.stats().usage_bytes <= capacity
    finally:
        tier.close()
