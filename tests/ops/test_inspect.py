"""`kvtiers inspect`: every namespace under an fs root (ours and another model's),
blocks, bytes, usage committed vs reserved vs capacity, ages - read while a live
writer holds reservations, without changing a byte, a name or a time."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from kvtiers.testing import random_keys

from tests.fs.helpers import BB, FILE, context, open_tier, store_keys

from .conftest import fs_config, kvtiers

CAP = 200 * FILE


def tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every name under `root`: (mode, mtime_ns, sha256 of a file's bytes)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
            out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, digest)
    return out


def test_inspect_lists_ours_and_others_with_reservations_of_a_live_writer(
        tmp_path: Path, mp: Any, children: list[Any]) -> None:
    root = tmp_path / "root"
    root.mkdir()
    before = time.time()
    ours_keys = random_keys(12) + [os.urandom(200)]  # and a long key (named in its file)
    other_keys = random_keys(5)
    a = open_tier(context(model="model-a"), root, 200)
    b = open_tier(context(model="model-b"), root, 200)
    try:
        assert store_keys(a, ours_keys).success and store_keys(b, other_keys).success
        fp_a, fp_b = a.namespace, b.namespace
    finally:
        a.close()
        b.close()
    # A live writer of model-a that reserved two more blocks and committed neither.
    from tests.fs import child

    ready = mp.Queue()
    pending = random_keys(3)
    p = mp.Process(target=child.die_half_way, args=(str(root), pending, BB, ready))
    p.start()
    children.append(p)
    ready.get(timeout=120)
    config = fs_config(tmp_path / "c.json", str(root), CAP)
    snapshot = tree(root)
    done = kvtiers("inspect", config, "--json")
    assert done.returncode == 0, done.stderr
    assert tree(root) == snapshot  # nothing changed, not even a time
    assert p.is_alive()
    doc = json.loads(done.stdout)
    assert doc["config_model"] == "model-a"
    (tier,) = doc["tiers"]
    assert tier["name"] == "fs" and tier["type"] == "fs"
    by_fp = {ns["namespace"]: ns for ns in tier["namespaces"]}
    assert set(by_fp) == {fp_a, fp_b}
    ours, other = by_fp[fp_a], by_fp[fp_b]
    assert ours["ours"] and not other["ours"]
    assert (ours["model"], other["model"]) == ("model-a", "model-b")
    assert ours["geometry"][0]["head_size"] == BB // 2 and ours["location"] == str(root)
    # die_half_way stored pending[0] and reserved pending[1:]
    assert ours["blocks"] == 14 and ours["committed_bytes"] == 14 * FILE
    assert ours["reserved_blocks"] == 2 and ours["reserved_bytes"] == 2 * FILE
    assert ours["usage_bytes"] == 16 * FILE and ours["capacity_bytes"] == CAP
    assert other["blocks"] == 5 and other["reserved_blocks"] == 0
    for ns, keys in ((ours, {k.hex() for k in ours_keys} | {pending[0].hex()}),
                     (other, {k.hex() for k in other_keys})):
        assert sum(b["blocks"] for b in ns["age_histogram"]) == ns["blocks"]
        assert ns["age_histogram"][0]["le"] == "1m"  # all just written
        assert ns["age_histogram"][0]["blocks"] == ns["blocks"]
        assert ns["oldest"]["key"] in keys and ns["newest"]["key"] in keys
        assert before - 2 <= ns["oldest"]["stored_at"] <= ns["newest"]["stored_at"]
        assert ns["newest"]["stored_at"] <= time.time() + 2 and ns["error"] is None
    human = kvtiers("inspect", config)
    assert human.returncode == 0, human.stderr
    assert "model-a" in human.stdout and "(ours)" in human.stdout
    assert "model-b" in human.stdout and "(other)" in human.stdout
    assert fp_a[:12] in human.stdout and "2 reserved" in human.stdout


def test_a_damaged_namespace_is_listed_with_its_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    tier = open_tier(context(model="model-a"), root, 200)
    try:
        assert store_keys(tier, random_keys(3)).success
    finally:
        tier.close()
    junk = root / ("0" * 32)  # a namespace directory of garbage
    junk.mkdir()
    (junk / "NAMESPACE.json").write_bytes(os.urandom(64))
    (junk / "snapshot.1").write_bytes(os.urandom(300))
    done = kvtiers("inspect", fs_config(tmp_path / "c.json", str(root), CAP), "--json")
    assert done.returncode == 0, done.stderr
    nss = {ns["namespace"]: ns for ns in json.loads(done.stdout)["tiers"][0]["namespaces"]}
    assert nss["0" * 32]["error"] and nss["0" * 32]["model"] is None
    assert [ns["blocks"] for fp, ns in nss.items() if fp != "0" * 32] == [3]


def test_errors_and_help(tmp_path: Path) -> None:
    for cmd in ("inspect", "verify"):
        done = kvtiers(cmd, "--help")
        assert done.returncode == 0 and "CONFIG" in done.stdout and "--json" in done.stdout
        memory = tmp_path / "m.json"
        memory.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [
            {"type": "memory", "capacity_bytes": 1 << 20}]}))
        done = kvtiers(cmd, str(memory))
        assert done.returncode == 2, done.stderr
        assert "no persistent tier" in done.stderr and "memory (not persistent)" in done.stderr
        assert "Traceback" not in done.stderr
        (tmp_path / "r").mkdir(exist_ok=True)
        done = kvtiers(cmd, fs_config(tmp_path / "c.json", str(tmp_path / "r"), CAP),
                       "--tier", "s3")
        assert done.returncode == 2 and "choose one of: fs" in done.stderr, done.stderr


def test_inspect_beside_a_writer_that_rotates_its_journal(
        tmp_path: Path, mp: Any, children: list[Any]) -> None:
    """Each survey folds a consistent state even while the writer keeps evicting and
    rotating (snapshot + journal files replaced under the reader): usage within the
    capacity, bytes equal to the blocks' files, never an error."""
    from tests.fs import child

    root = tmp_path / "root"
    root.mkdir()
    capacity = 40
    ready = mp.Event()
    p = mp.Process(target=child.writer, args=(str(root), capacity, 3, str(tmp_path / "log"),
                                              ready, 1 << 14))
    p.start()
    children.append(p)
    assert ready.wait(120)
    config = fs_config(tmp_path / "c.json", str(root), capacity * FILE)
    seen = []
    while len(seen) < 3:
        done = kvtiers("inspect", config, "--json")
        assert done.returncode == 0, done.stderr
        (ns,) = json.loads(done.stdout)["tiers"][0]["namespaces"]
        assert ns["error"] is None
        assert ns["committed_bytes"] == ns["blocks"] * FILE
        assert ns["usage_bytes"] <= capacity * FILE
        assert ns["reserved_bytes"] == ns["reserved_blocks"] * FILE
        seen.append(ns["blocks"])
        assert p.is_alive()
    gens = [n for n in os.listdir(root / ns["namespace"]) if n.startswith("journal.")]
    assert max(seen) > 0 and max(int(g.split(".")[1]) for g in gens) > 1  # it rotated
