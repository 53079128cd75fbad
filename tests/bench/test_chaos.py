"""The chaos bench (bench/chaos/): its short profile, run here, must find no wrong
byte, no lost block and usage equal to what each store really holds, with each
fault having had its effect; and its checks must see what they look for (a tier
that serves wrong bytes, or drops blocks without saying so, is caught; blocks a
tier reports evicting are not losses). Times are reported, never asserted."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers.testing import random_keys

from bench.chaos import (
    damage,
    driver,
    fs_full,
    fs_kills,
    p2p_freeze,
    p2p_node,
    redis_freeze,
    redis_kill,
    run,
    s3_freeze,
    s3_kill,
)
from bench.chaos.driver import Driver, open_tier
from bench.chaos.report import Row
from bench.chaos.report import table as report_table

REPO = Path(__file__).resolve().parents[2]
BLOCK = 4096


def _short(name: str, tmp_path: Path) -> list[Row]:
    rows, work = run.run_scenarios([name], "short", tmp_path, seed=3)
    for row in rows:
        print(row.as_dict())
    ran = [r for r in rows if not r.skipped]
    if not ran:
        pytest.skip("; ".join(r.skipped for r in rows))
    for row in ran:
        assert row.problems == [], (row.problems, row.notes, f"kept: {work}")
        assert row.wrong_bytes == 0
        assert row.lost_blocks == 0
        assert row.blocks_checked > 0
        assert row.usage_bytes == row.store_bytes, row.notes
        assert row.usage_bytes is not None and row.usage_bytes > 0
    assert not work.exists()  # removed when nothing went wrong
    return ran


def test_fs_disk_full_stores_fail_full_then_succeed_again(tmp_path: Path) -> None:
    (row,) = _short(fs_full.NAME, tmp_path)
    assert row.errors["store:full"] > 0
    assert row.recovery_s is not None


def test_fs_engines_killed_at_random_lose_nothing(tmp_path: Path) -> None:
    (row,) = _short(fs_kills.NAME, tmp_path)
    rounds = fs_kills.PROFILES["short"]["rounds"]
    assert row.rounds == rounds
    assert row.errors["writer:killed"] == rounds * len(fs_kills.WRITERS)
    assert row.errors["bench:killed"] + row.errors["bench:ended"] == rounds
    assert row.blocks_stored > 0


@pytest.mark.parametrize("name", [s3_kill.NAME, s3_freeze.NAME])
def test_s3_server_killed_or_frozen_then_back_recovers(name: str, tmp_path: Path) -> None:
    for row in _short(name, tmp_path):
        assert sum(row.errors.values()) > 0  # jobs failed while the server was away
        assert row.recovery_s is not None


@pytest.mark.parametrize("name", [redis_kill.NAME, redis_freeze.NAME])
def test_redis_server_killed_or_frozen_then_back_recovers(name: str, tmp_path: Path) -> None:
    (row,) = _short(name, tmp_path)
    assert row.errors["store:io"] + row.errors["store:timeout"] > 0  # the outage was seen
    assert row.recovery_s is not None


def test_p2p_node_killed_comes_back_empty_and_the_puller_recovers(tmp_path: Path) -> None:
    (row,) = _short(p2p_node.NAME, tmp_path)
    assert row.rounds == p2p_node.PROFILES["short"]["outages"]
    assert row.errors["gone-with-node"] > 0  # the kill took the node's pool with it
    assert row.recovery_s is not None


def test_p2p_node_frozen_keeps_its_blocks_and_the_puller_recovers(tmp_path: Path) -> None:
    (row,) = _short(p2p_freeze.NAME, tmp_path)
    assert sum(row.errors.values()) > 0  # jobs failed while the node was frozen
    assert row.errors["gone-with-node"] == 0
    assert row.recovery_s is not None


def test_damaged_blocks_are_never_served_and_fail_one_load_each(tmp_path: Path) -> None:
    rows = _short(damage.NAME, tmp_path)
    assert {r.scenario for r in rows} >= {"damage (fs flip)", "damage (fs truncate)"}
    damaged = damage.PROFILES["short"]["damaged"]
    for row in rows:
        kind = row.scenario.split()[-1].rstrip(")")
        hit = row.errors[f"damaged:{kind}"]  # keys in the objects damaged
        assert hit == damaged if "segments" not in row.scenario else hit >= damaged // 4
        assert row.errors["refailed"] == 0
        failed = row.errors["load:corrupt"] + row.errors["load:missing"]
        assert failed > 0  # the damage had its effect
        assert failed + row.errors["damaged:served-right"] == hit  # one failure each


# -- the checks themselves ----------------------------------------------------------


@pytest.fixture
def faulty() -> Iterator[list[object]]:
    tiers: list[object] = []
    yield tiers
    for tier in tiers:
        tier.close()  # type: ignore[attr-defined]


def _drive(tiers: list[object], section: dict[str, object]) -> tuple[Driver, Row]:
    tier = open_tier(section, "chaos-selftest", BLOCK)
    tiers.append(tier)
    row = Row("selftest")
    return Driver(tier, row), row


def test_a_tier_serving_wrong_bytes_is_caught(faulty: list[object]) -> None:
    drive, row = _drive(faulty, {"type": "faulty", "corrupt_rate": 1.0,
                                 "corrupt_detected": False, "ops": ["load"],
                                 "inner": {"type": "memory", "capacity_bytes": 1 << 20}})
    assert drive.store().success
    drive.check_all()
    row.usage_bytes = row.store_bytes = 0
    row.check()
    assert row.wrong_bytes == 8  # one byte flipped in each of the 8 blocks
    assert row.problems == ["8 wrong bytes served"]


def test_blocks_dropped_silently_are_lost_and_evicted_ones_are_not(
        faulty: list[object]) -> None:
    # A memory tier of 4 blocks given 24: it evicts what it stored before, and says so.
    drive, row = _drive(faulty, {"type": "memory", "capacity_bytes": 4 * BLOCK})
    for _ in range(3):
        drive.store()
    assert drive.removed >= 8 and len(drive.stored) == 4
    assert row.blocks_stored == drive.removed + 4
    assert drive.check_all() == 0
    # Keys it was never given (as a log of keys reported stored that the tier lost).
    assert drive.check_all(random_keys(3)) == 3
    row.check()
    assert row.lost_blocks == 3 and "3 blocks reported stored were lost" in row.problems


def test_the_runner_refuses_an_unknown_scenario_naming_the_allowed_ones() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.chaos.run", "--scenarios", "fs-ful"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 2
    assert "unknown scenario(s) ['fs-ful']" in out.stderr
    assert all(name in out.stderr for name in run.SCENARIOS)


class _Clock:
    """A stand-in for the driver's `time`: seconds pass only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_a_tier_blocking_the_scheduler_thread_shows_as_a_stall(
        faulty: list[object], monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(driver, "time", clock)
    drive, row = _drive(faulty, {"type": "memory", "capacity_bytes": 1 << 20})
    tier = drive.tier
    submit = tier.submit_store

    def blocking_submit(job: object) -> None:
        clock.now += 7.0  # as if it waited for I/O on the scheduler's thread
        submit(job)  # type: ignore[arg-type]

    drive.store()
    assert row.scheduler_stall_s == 0.0
    tier.submit_store = blocking_submit  # type: ignore[method-assign]
    drive.store()
    drive.check_all()
    assert row.scheduler_stall_s == 7.0 and row.scheduler_stall_call == "submit_store"
    assert "stall s" in report_table([row])
