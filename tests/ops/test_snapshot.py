"""`kvtiers snapshot save/load`: a tier's blocks to a zarr store and into a fresh
tier, every block byte-equal and served as a hit; hottest first with --hottest; a
damaged block in the snapshot refused by its checksum; another model's refused."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import random_keys

from tests.fs.helpers import FILE, context, load_and_check, open_tier, store_keys

from .conftest import fs_config, kvtiers

pytest.importorskip("zarr")

CAP = 200 * FILE


def _filled(root: Path, keys: list[bytes], later: list[bytes]) -> str:
    root.mkdir()
    tier = open_tier(context(model="model-a", slots=128), root, 200)
    try:
        assert store_keys(tier, keys).success
        time.sleep(0.05)  # the later blocks are newer (file times)
        assert store_keys(tier, later).success
        return tier.namespace
    finally:
        tier.close()


def test_save_then_load_into_a_fresh_tier_serves_every_block(tmp_path: Path) -> None:
    keys, later = random_keys(70), random_keys(5)  # more than one job of 64
    fp = _filled(tmp_path / "a", keys, later)
    (tmp_path / "b").mkdir()
    snap = str(tmp_path / "snap.zarr")
    done = kvtiers("snapshot", "save", fs_config(tmp_path / "a.json", str(tmp_path / "a"), CAP),
                   snap, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["blocks"] == 75 and doc["namespace"] == fp and doc["failed"] == {}
    cfg_b = fs_config(tmp_path / "b.json", str(tmp_path / "b"), CAP)
    done = kvtiers("snapshot", "load", cfg_b, snap, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["blocks"] == 75
    tier = open_tier(context(model="model-a"), tmp_path / "b", 200)
    try:
        assert all(tier.lookup(k) is LookupResult.HIT for k in keys + later)
        assert load_and_check(tier, keys[:64]).success  # byte for byte
        assert load_and_check(tier, keys[64:] + later).success
        assert tier.inventory().keys() == set(keys + later)
    finally:
        tier.close()
    # --hottest: the hottest blocks only (the later ones: stored last, never used since)
    done = kvtiers("snapshot", "save", fs_config(tmp_path / "a.json", str(tmp_path / "a"), CAP),
                   str(tmp_path / "hot.zarr"), "--hottest", "5", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["blocks"] == 5, done.stderr
    from kvtiers.ops.snapshot_store import SnapshotReader

    saved = [k for chunk in SnapshotReader(str(tmp_path / "hot.zarr")).chunks()
             for k, _, _ in chunk]
    assert set(saved) == set(later)


def test_a_damaged_block_is_refused_and_another_model_too(tmp_path: Path) -> None:
    keys = random_keys(6)
    _filled(tmp_path / "a", keys, [])
    snap = tmp_path / "snap.zarr"
    assert kvtiers("snapshot", "save", fs_config(tmp_path / "a.json", str(tmp_path / "a"), CAP),
                   str(snap)).returncode == 0
    from kvtiers.ops.snapshot_store import SnapshotReader

    reader = SnapshotReader(str(snap))
    order = [k for chunk in reader.chunks() for k, _, _ in chunk]
    # one uncompressed chunk of whole blocks, row-major
    (chunk_file,) = [p for p in (snap / "blocks" / "c").rglob("*") if p.is_file()]
    data = bytearray(chunk_file.read_bytes())
    data[2 * reader.block_bytes + 100] ^= 0x01  # the third block's bytes
    chunk_file.write_bytes(bytes(data))
    (tmp_path / "b").mkdir()
    done = kvtiers("snapshot", "load", fs_config(tmp_path / "b.json", str(tmp_path / "b"), CAP),
                   str(snap), "--json")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["bad"] == [order[2].hex()] and doc["blocks"] == 5
    tier = open_tier(context(model="model-a"), tmp_path / "b", 200)
    try:
        assert tier.inventory().keys() == set(order) - {order[2]}
        assert load_and_check(tier, [k for k in order if k != order[2]]).success
    finally:
        tier.close()
    (tmp_path / "c").mkdir()
    done = kvtiers("snapshot", "load", fs_config(tmp_path / "c.json", str(tmp_path / "c"), CAP,
                                                 model="model-b"), str(snap))
    assert done.returncode == 2 and "model-a" in done.stderr and "model-b" in done.stderr
    assert os.listdir(tmp_path / "c") == []  # nothing written


def test_a_memory_url_in_process(tmp_path: Path) -> None:
    from kvtiers.ops.snapshot import BATCH, load_tier, save_tier
    from kvtiers.ops.snapshot_store import SnapshotReader

    keys = random_keys(10)
    (tmp_path / "a").mkdir()
    a = open_tier(context(model="model-a", slots=BATCH), tmp_path / "a", 200)
    (tmp_path / "b").mkdir()
    b = open_tier(context(model="model-a", slots=BATCH), tmp_path / "b", 200)
    try:
        assert store_keys(a, keys).success
        assert save_tier(a, "memory://kvtiers-test/snap").blocks == 10
        reader = SnapshotReader("memory://kvtiers-test/snap")
        assert reader.namespace == a.ctx.namespace and reader.count == 10
        assert load_tier(b, reader).blocks == 10
        assert load_and_check(b, keys).success
    finally:
        a.close()
        b.close()


def test_without_zarr_the_error_names_the_extra(tmp_path: Path) -> None:
    import subprocess
    import sys

    from .conftest import REPO

    (tmp_path / "a").mkdir()
    env = dict(os.environ, KVTIERS_TEST_BLOCKED="zarr")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "blocked"),
                                         env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "kvtiers", "snapshot", "load",
         fs_config(tmp_path / "a.json", str(tmp_path / "a"), CAP), str(tmp_path / "s")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "kvtiers-core[snapshot]" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
