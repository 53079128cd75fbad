"""Untrusted names and contents under a root never crash the tier's start-up
(issue 11, item 4; DESIGN.md invariant 7): each gets a logged reason and is
skipped, and the tier keeps serving what is its own."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from kvtiers.testing import random_keys
from kvtiers_fs import list_namespaces
from kvtiers_fs.disk import layout
from kvtiers_fs.schema import check_machine

from tests.fs.helpers import (
    FILE,
    context,
    disk_files,
    load_and_check,
    ns_dir,
    open_tier,
    store_keys,
)

NEIGHBOUR = "ab" * 16  # another namespace's directory name (32 hex digits)

NAMESPACE_DOCS: dict[str, Callable[[Path], None]] = {
    "list": lambda p: p.write_text("[1, 2]"),
    "string": lambda p: p.write_text('"model-x"'),
    "model_not_text": lambda p: p.write_text('{"model": 5, "revision": [1]}'),
    "deeply_nested": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
    "not_json": lambda p: p.write_bytes(os.urandom(300)),
    "directory": lambda p: p.mkdir(),
    "fifo": lambda p: os.mkfifo(p),
    "symlink": lambda p: p.symlink_to("/etc/passwd"),
}


@pytest.mark.parametrize("kind", NAMESPACE_DOCS)
def test_a_neighbours_namespace_file_of_any_content(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "root"
    (root / NEIGHBOUR).mkdir(parents=True)
    NAMESPACE_DOCS[kind](root / NEIGHBOUR / "NAMESPACE.json")
    listed = list_namespaces(str(root))  # never raises
    assert [n.fingerprint for n in listed] == [NEIGHBOUR] and listed[0].error
    options = {"root_dir": str(root), "capacity_bytes": 1 << 20}
    notes = check_machine(options)  # what `kvtiers validate` runs
    assert any(NEIGHBOUR in n.message for n in notes)
    tier = open_tier(context(), root)  # the constructor lists the neighbours too
    try:
        keys = random_keys(2)
        assert store_keys(tier, keys).success and load_and_check(tier, keys).success
    finally:
        tier.close()


def test_kvtiers_validate_with_a_hostile_neighbour(tmp_path: Path) -> None:
    from tests.config.test_cli import kvtiers

    root = tmp_path / "root"
    (root / NEIGHBOUR).mkdir(parents=True)
    (root / NEIGHBOUR / "NAMESPACE.json").write_text("[1, 2]")
    config = json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [
        {"type": "fs", "root_dir": str(root), "capacity_bytes": 1 << 20}]})
    done = kvtiers("validate", config)
    assert done.returncode == 0, done.stderr
    assert "machine check failed" not in done.stderr and NEIGHBOUR in done.stderr


def _plant(ns: Path, gen: int) -> list[str]:
    """Names a tier never writes, of every kind, in every directory it reads."""
    planted = []

    def file(path: Path, data: bytes = b"x") -> None:
        path.write_bytes(data)
        planted.append(str(path.relative_to(ns)))

    for name in ("snapshot.\u00b2", "journal.\u00b2", "snapshot.\u0663", "snapshot.01",
                 "snapshot.0", "snapshot.-1", "snapshot.+7", "snapshot. 9",
                 "snapshot.99999999999999999999999", "journal.18446744073709551616",
                 f"snapshot.{gen}.bak", "snapshotx.3"):
        file(ns / name, os.urandom(100))
    (ns / f"snapshot.{gen + 5}").mkdir()  # the newest snapshot "is" a directory
    os.mkfifo(ns / f"journal.{gen + 5}")
    (ns / f".snapshot.{gen + 9}.zz.tmp").mkdir()
    writers = ns / "writers"
    for name in ("zz", "ZZZZZZZZZZZZZZZZ", "0123456789ABCDEF", ".x.tmp", ".0000000000000001.tmp"):
        file(writers / name)
    (writers / "0123456789abcdef").mkdir()  # a "writer" that is a directory
    os.mkfifo(writers / "00000000000000ff")
    (writers / "00000000000000fe").symlink_to("/etc/passwd")
    blocks = ns / "blocks"
    (blocks / "zzz").mkdir()
    # Shard names no stored key uses (random keys may have made any 3-hex-digit shard).
    names = (f"{(0xABC + i) % 4096:03x}" for i in range(4096))
    free = (n for n in names if not (blocks / n).exists())
    file(blocks / next(free))  # a shard name that is a file
    (blocks / next(free)).symlink_to("/etc", target_is_directory=True)
    shard = next(p for p in blocks.iterdir() if p.is_dir() and not p.is_symlink()
                 and p.name != "zzz")
    file(shard / ("AB" * 36 + ".kvb"), os.urandom(FILE))  # upper-case hex
    file(shard / ("ab" * 41 + ".kvb"), os.urandom(FILE))  # longer than an ident
    file(shard / ".kvb", os.urandom(FILE))
    file(shard / "not-hex.kvb", os.urandom(FILE))
    file(shard / ".abcd.zzzz.tmp")
    return planted


def test_hostile_names_in_our_namespace_never_crash_start_up(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    ctx = context()
    keys = random_keys(8)
    tier = open_tier(ctx, root)
    try:
        assert store_keys(tier, keys).success
    finally:
        tier.close()
    ns = ns_dir(root, ctx)
    gen = max(int(p.name.split(".")[1]) for p in ns.glob("snapshot.*"))
    # A valid block file of a key we hold, copied into a shard that is not its own.
    src = Path(tier.block_path(keys[0]))
    wrong = next(p for p in (ns / "blocks").iterdir() if p.is_dir() and p != src.parent)
    (wrong / src.name).write_bytes(src.read_bytes())
    planted = _plant(ns, gen)
    for attempt in range(2):  # the next start-up, and the one after it
        again = open_tier(context(), root)
        try:
            assert load_and_check(again, keys).success, attempt
            fresh = random_keys(4)
            assert store_keys(again, fresh).success
            assert load_and_check(again, fresh).success
            inv = again.inventory()
            assert inv.keys() >= set(keys) | set(fresh)
            assert inv.reserved_blocks == 0
        finally:
            again.close()
    for name in planted:  # never removed: not the tier's names
        if not name.startswith(("snapshot.", "journal.")):
            assert os.path.lexists(ns / name), name
    assert disk_files(ns)[2] >= 1  # the planted ".abcd.zzzz.tmp" is left alone


def test_a_hostile_namespace_file_of_our_own_is_rewritten(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    ctx = context()
    open_tier(ctx, root).close()
    (ns_dir(root, ctx) / "NAMESPACE.json").write_text("[1, 2]")
    tier = open_tier(context(), root)
    tier.close()
    (mine,) = list_namespaces(str(root))
    assert mine.error is None and mine.model == "model-a"


def test_generation_names_are_canonical() -> None:
    from kvtiers_fs.journal import records as jr

    assert jr.generation_of("snapshot.12", "snapshot") == 12
    for name in ("snapshot.\u00b2", "snapshot.012", "snapshot.0", "snapshot.-1",
                 "snapshot.1_000", "snapshot.\u0663", "snapshot." + "9" * 30,
                 f"snapshot.{jr.MAX_GENERATION}", "journal.3", "snapshot."):
        assert jr.generation_of(name, "snapshot") is None, name
    assert layout.parse_writer_name("0123456789abcdef") == 0x0123456789ABCDEF
    assert layout.parse_writer_name("0123456789ABCDEF") is None
    assert layout.parse_block_name("ab" * 41 + ".kvb") is None
