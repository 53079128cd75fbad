"""kvtiers-sqlite's tests: the shared conformance suite, plus what is particular to
keeping blocks in one SQLite file."""

from __future__ import annotations

import contextlib
import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kvtiers.errors import KvtiersError
from kvtiers.sdk import FailureReason, LookupResult, SecondaryTier, TierContext
from kvtiers.testing import (
    JobTracker,
    TierConformance,
    fill_slots,
    make_context,
    make_namespace,
    random_keys,
)
from kvtiers_sqlite.tier import SqliteTier

BLOCK = 16384


class TestSqliteTier(TierConformance):
    block_bytes = BLOCK

    def make_tier(self, ctx: TierContext, capacity_bytes: int) -> SecondaryTier:
        # The suite gives each test a fresh tmp_path; every tier of one test must
        # open the same storage (a restart, another namespace on the same file).
        path = self.tmp_path / "kv.sqlite"
        return SqliteTier(ctx, {"path": str(path), "capacity_bytes": capacity_bytes})

    def restart(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        tier.close()
        return SqliteTier(ctx, tier.config)

    def corrupt(self, tier: SecondaryTier, key: bytes) -> None:
        """Flip one byte of the stored copy, through a connection of our own."""
        assert isinstance(tier, SqliteTier)
        where = (key, tier.ctx.namespace.fingerprint)
        with contextlib.closing(sqlite3.connect(tier.path)) as db, db:
            (data,) = db.execute(
                "SELECT data FROM blocks WHERE key=? AND namespace=?", where
            ).fetchone()
            db.execute(
                "UPDATE blocks SET data=? WHERE key=? AND namespace=?",
                (bytes([data[0] ^ 0xFF]) + data[1:], *where),
            )

    def stored_bytes(self, tier: SecondaryTier) -> int:
        """The block bytes of every row in the file (the bound is the whole file's),
        through a connection of our own."""
        assert isinstance(tier, SqliteTier)
        with contextlib.closing(sqlite3.connect(tier.path)) as db:
            (total,) = db.execute("SELECT COALESCE(SUM(length(data)), 0) FROM blocks").fetchone()
        return int(total)


# --- particular to this tier -------------------------------------------------------

OpenTier = Callable[..., SqliteTier]


@pytest.fixture
def open_tier(tmp_path: Path) -> Iterator[OpenTier]:
    """Open SqliteTiers on one file in tmp_path; all closed at the end of the test."""
    opened: list[SqliteTier] = []

    def open_(ctx: TierContext, capacity_blocks: int = 8) -> SqliteTier:
        config = {"path": str(tmp_path / "kv.sqlite"), "capacity_bytes": capacity_blocks * BLOCK}
        opened.append(SqliteTier(ctx, config))
        return opened[-1]

    yield open_
    for tier in opened:
        tier.close()


def context(model: str = "kvtiers-sqlite/test-model") -> TierContext:
    return make_context(BLOCK, 8, namespace=make_namespace(model, BLOCK))


def test_capacity_bounds_the_whole_file_across_namespaces(open_tier: OpenTier) -> None:
    old, new = context("old-model"), context("new-model")
    tier = open_tier(old, capacity_blocks=4)
    old_keys = random_keys(4)
    fill_slots(old.pool, range(4))
    assert JobTracker(tier).run_store(old_keys, range(4)).success
    tier.close()

    tier = open_tier(new, capacity_blocks=4)  # another model: old blocks are invisible...
    assert [tier.lookup(k) for k in old_keys] == [LookupResult.MISS] * 4
    fill_slots(new.pool, range(3))
    assert JobTracker(tier).run_store(random_keys(3), range(3)).success  # ...and go first
    assert tier.stats().usage_bytes == 4 * BLOCK and tier.stats().evictions == 3
    tier.close()

    tier = open_tier(old, capacity_blocks=4)
    hits = [tier.lookup(k) is LookupResult.HIT for k in old_keys]
    assert hits == [False, False, False, True]


def test_a_job_larger_than_the_tier_keeps_its_own_blocks(open_tier: OpenTier) -> None:
    ctx = context()
    tier = open_tier(ctx, capacity_blocks=3)
    keys = random_keys(5)
    fill_slots(ctx.pool, range(5))
    result = JobTracker(tier).run_store(keys, range(5))
    assert result.ok == keys[:3] and result.failed == dict.fromkeys(keys[3:], FailureReason.FULL)


def test_a_damaged_file_costs_misses_not_exceptions(open_tier: OpenTier) -> None:
    ctx = context()
    tier = open_tier(ctx)
    jobs = JobTracker(tier)
    keys = random_keys(2)
    fill_slots(ctx.pool, range(2))
    assert jobs.run_store(keys, range(2)).success
    with contextlib.closing(sqlite3.connect(tier.path)) as other:
        other.execute("DROP TABLE blocks")
    assert jobs.run_load(keys, [2, 3]).failed == dict.fromkeys(keys, FailureReason.IO)
    assert jobs.run_store(keys, range(2)).failed == dict.fromkeys(keys, FailureReason.IO)


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "kv.sqlite"
    path.write_bytes(random.Random(9).randbytes(8192))
    with pytest.raises(KvtiersError, match=f"cannot open {path}: file is not a database"):
        SqliteTier(context(), {"path": str(path), "capacity_bytes": BLOCK})


def test_rows_of_this_namespace_that_leave_are_reported(open_tier: OpenTier) -> None:
    old, new = context("old-model"), context("new-model")
    tier = open_tier(old, capacity_blocks=2)
    old_keys = random_keys(2)
    fill_slots(old.pool, range(2))
    assert JobTracker(tier).run_store(old_keys, range(2)).success
    tier.close()
    tier = open_tier(new, capacity_blocks=2)
    new.events.enable()
    keys = random_keys(3)
    fill_slots(new.pool, range(3))
    jobs = JobTracker(tier)
    assert jobs.run_store(keys[:2], range(2)).success  # the old model's rows make way...
    assert new.events.take() == []  # ...and are not this tier's keys
    assert jobs.run_store(keys[2:], [2]).success
    assert new.events.take() == [keys[0]]
