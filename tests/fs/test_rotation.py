"""Snapshots written in the background: a new process loads the newest snapshot and
replays the journal from its base offset; a rotator killed after renaming its
snapshot into place but before appending ROTATE is completed by the next lock
holder - nothing lost, nothing counted twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kvtiers_fs.namespace.store as store_mod
import pytest
from kvtiers.testing import random_keys, wait_until
from kvtiers_fs.journal import records as jr

from tests.fs.child import die_while_rotating
from tests.fs.helpers import (
    FILE,
    context,
    disk_files,
    load_and_check,
    ns_dir,
    open_tier,
    store_keys,
)


def _generations(ns: Path) -> list[int]:
    return sorted(int(p.name.split(".")[1]) for p in ns.glob("snapshot.*"))


def test_a_background_rotation_is_followed_and_replayed_from_its_base(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "ROTATE_MIN_BYTES", 4096)
    monkeypatch.setattr(store_mod, "CLOSE_ROTATE_BYTES", 1 << 40)  # none at close
    ctx = context(slots=64)
    tier = open_tier(ctx, tmp_path)
    reader = open_tier(context(slots=64), tmp_path)  # another process, following
    keys = random_keys(200)
    try:
        for i in range(0, 200, 40):
            assert store_keys(tier, keys[i : i + 40]).success
        store = tier.stores[0]
        wait_until(lambda: store.rotations >= 1, "a background rotation")
        ns = ns_dir(tmp_path, ctx)
        snap = jr.read_snapshot_head((ns / f"snapshot.{_generations(ns)[-1]}").read_bytes())
        assert snap.base_gen == snap.gen - 1 and snap.base_offset > 0
        reader.stores[0].sync()
        assert reader.inventory().keys() == tier.inventory().keys() == set(keys)
        fresh = open_tier(context(slots=64), tmp_path)  # loads snapshot + replay
        try:
            inv = fresh.inventory()
            assert inv.keys() == set(keys) and inv.reserved_blocks == 0
            assert fresh.stats().usage_bytes == 200 * FILE
            assert load_and_check(fresh, keys[::20]).success
        finally:
            fresh.close()
    finally:
        reader.close()
        tier.close()


def test_a_rotator_killed_before_its_rotate_is_completed(mp: Any, children: list[Any],
                                                         tmp_path: Path) -> None:
    keys = random_keys(30)
    queue = mp.Queue()
    proc = mp.Process(target=die_while_rotating, args=(str(tmp_path), keys, 16384, queue),
                      daemon=True)
    children.append(proc)
    proc.start()
    queue.get(timeout=120)  # a bound for a loaded CI machine, not a timing check
    proc.join(120)
    assert proc.exitcode == -9
    ctx = context(slots=64)
    ns = ns_dir(tmp_path, ctx)
    gens = _generations(ns)
    assert len(gens) == 2  # the new snapshot is in place, its ROTATE is not
    journal = (ns / f"journal.{gens[0]}").read_bytes()
    assert jr.ROTATE not in {r.op for f in _frames(journal) for r in f}
    tier = open_tier(ctx, tmp_path)
    try:
        inv = tier.inventory()
        assert inv.keys() == set(keys) and inv.reserved_blocks == 0
        assert tier.stats().usage_bytes == 30 * FILE == disk_files(ns)[1]
        more = random_keys(5)
        assert store_keys(tier, more).success
        other = open_tier(context(slots=64), tmp_path)
        try:
            assert other.inventory().keys() == set(keys) | set(more)
            assert load_and_check(other, keys[:5] + more).success
        finally:
            other.close()
    finally:
        tier.close()
    journal = (ns / f"journal.{gens[0]}").read_bytes()
    assert jr.ROTATE in {r.op for f in _frames(journal) for r in f}  # completed


def _frames(data: bytes) -> list[list[jr.Record]]:
    import os
    import tempfile

    fd, name = tempfile.mkstemp()
    try:
        os.write(fd, data)
        return jr.read_frames(fd, 0).frames
    finally:
        os.close(fd)
        os.unlink(name)
