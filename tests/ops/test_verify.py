"""`kvtiers verify`: real damaged files - a bit flipped, a file truncated, another
namespace's block at a block's name, a file deleted, a long key's header broken -
each reported by reason; `--repair` removes exactly those through the tier's
accounting (usage exact, the good blocks still served byte for byte); and beside a
live writer that keeps evicting, nothing good is reported bad."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from kvtiers.testing import random_keys

from tests.fs.helpers import FILE, context, disk_files, load_and_check, open_tier, store_keys

from .conftest import fs_config, kvtiers

CAP = 200 * FILE


def _bad(doc: dict[str, Any], fp: str) -> dict[str, Any]:
    (tier,) = doc["tiers"]
    (ns,) = [n for n in tier["namespaces"] if n["namespace"] == fp]
    out: dict[str, Any] = ns
    return out


def test_damage_is_found_by_reason_and_repaired_with_exact_usage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    keys = random_keys(20)
    long_key = os.urandom(300)  # named by a hash: only its file's header names it
    a = open_tier(context(model="model-a"), root, 200)
    b = open_tier(context(model="model-b"), root, 200)
    try:
        assert store_keys(a, [*keys, long_key]).success
        assert store_keys(b, keys[:1]).success
        fp_a, fp_b = a.namespace, b.namespace
        path = {k: Path(a.block_path(k)) for k in [*keys, long_key]}
        foreign_src = Path(b.block_path(keys[0]))
    finally:
        a.close()
        b.close()
    flipped = bytearray(path[keys[1]].read_bytes())
    flipped[4096 + 777] ^= 0x10  # one bit of the block's bytes
    path[keys[1]].write_bytes(bytes(flipped))
    with open(path[keys[2]], "r+b") as f:
        f.truncate(FILE - 100)
    shutil.copyfile(foreign_src, path[keys[0]])  # model-b's valid block, same key
    path[keys[3]].unlink()
    header = bytearray(path[long_key].read_bytes())
    header[20] ^= 0xFF
    path[long_key].write_bytes(bytes(header))
    stray = path[keys[4]].parent / "not-a-block.txt"
    stray.write_bytes(os.urandom(50))
    blocks_dir = path[keys[4]].parent.parent
    copied = path[keys[5]].with_name(path[keys[5]].name[:-1] + "0")  # a user's copy
    shutil.copyfile(path[keys[5]], copied)
    (blocks_dir / "README").write_bytes(os.urandom(10))
    others = sorted([f"{stray.parent.name}/{stray.name}", f"{copied.parent.name}/{copied.name}",
                     "README"])
    expected = {keys[0].hex(): "foreign", keys[1].hex(): "checksum",
                keys[2].hex(): "truncated", keys[3].hex(): "missing", None: "header"}
    config = fs_config(tmp_path / "c.json", str(root), CAP)

    done = kvtiers("verify", config, "--json")
    assert done.returncode == 1, done.stderr
    ns = _bad(json.loads(done.stdout), fp_a)
    assert {b["key"]: b["reason"] for b in ns["bad"]} == expected
    assert ns["by_reason"] == {"foreign": 1, "checksum": 1, "truncated": 1, "missing": 1,
                               "header": 1}
    assert ns["checked"] == 21 and not any(b["removed"] for b in ns["bad"])
    assert _bad(json.loads(done.stdout), fp_b)["ok"]  # the other model's: checked, good
    (note,) = ns["notes"]  # every entry the tier did not write, named
    assert note.startswith(f"3 entries in {blocks_dir} that this tier did not write: ")
    assert all(name in note for name in others) and "left alone" in note
    assert path[keys[1]].read_bytes() == bytes(flipped)  # without --repair: untouched

    done = kvtiers("verify", config, "--repair", "--json")
    assert done.returncode == 1, done.stderr  # something was wrong (and is repaired)
    ns = _bad(json.loads(done.stdout), fp_a)
    assert all(b["removed"] for b in ns["bad"]) and len(ns["bad"]) == 5
    assert ns["removed_bytes"] == 5 * FILE
    human = kvtiers("verify", config)
    assert human.returncode == 0, human.stdout + human.stderr
    assert "every block is good" in human.stdout
    assert "3 entries in" in human.stdout  # reported on every run, never removed
    assert stray.exists() and copied.exists() and (blocks_dir / "README").exists()

    a = open_tier(context(model="model-a"), root, 200)
    try:
        good = keys[4:]
        inv = a.inventory()
        assert inv.keys() == set(good)
        assert a.stats().usage_bytes == len(good) * FILE == inv.committed_bytes
        blocks, nbytes, _ = disk_files(root / fp_a)
        assert (blocks, nbytes) == (len(good), len(good) * FILE)
        assert load_and_check(a, good).success
        assert not load_and_check(a, [*keys[:4], long_key]).ok
    finally:
        a.close()


def test_beside_a_live_writer_that_evicts_nothing_good_is_bad(
        tmp_path: Path, mp: Any, children: list[Any]) -> None:
    from tests.fs import child

    root = tmp_path / "root"
    root.mkdir()
    capacity = 48
    ready = mp.Event()
    p = mp.Process(target=child.writer, args=(str(root), capacity, 7,
                                              str(tmp_path / "log"), ready))
    p.start()
    children.append(p)
    assert ready.wait(120)
    config = fs_config(tmp_path / "c.json", str(root), capacity * FILE)
    deadline = time.monotonic() + 120
    while disk_files(root / context(model="model-a").namespace.fingerprint)[0] < capacity // 2:
        assert time.monotonic() < deadline and p.is_alive()
        time.sleep(0.2)
    checked = vanished = 0
    for _ in range(3):  # the writer keeps storing, evicting, recycling files
        done = kvtiers("verify", config, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        (ns,) = json.loads(done.stdout)["tiers"][0]["namespaces"]
        assert ns["bad"] == [] and ns["ok"]
        checked += ns["checked"]
        vanished += ns["vanished"]
        assert p.is_alive()
    assert checked > 0
    print(f"checked {checked} blocks beside the writer, {vanished} evicted meanwhile")
    # Now one block damaged beside it: found and removed, the writer unharmed.
    # (the writer is stopped meanwhile: a file it recycled as another block's while
    # the flip is written would damage a block this test does not know of)
    os.kill(p.pid, signal.SIGSTOP)
    try:
        damaged = [k for k in child.read_log(str(tmp_path / "log"))[-8:] if _flip(root, k)]
    finally:
        os.kill(p.pid, signal.SIGCONT)
    assert damaged
    done = kvtiers("verify", config, "--repair", "--json")
    (ns,) = json.loads(done.stdout)["tiers"][0]["namespaces"]
    # The damaged block may have been evicted by the writer before verify reached it.
    assert done.returncode in (0, 1) and all(b["reason"] == "checksum" for b in ns["bad"])
    assert {bytes.fromhex(b["key"]) for b in ns["bad"]} <= set(damaged)
    assert all(b["removed"] for b in ns["bad"]) and p.is_alive()
    p.kill()
    p.join(30)
    a = open_tier(context(model="model-a"), root, capacity)  # settles the dead writer
    try:
        inv = a.inventory()
        blocks, nbytes, _ = disk_files(root / a.namespace)
        assert a.stats().usage_bytes == inv.committed_bytes == nbytes == blocks * FILE
        assert load_and_check(a, sorted(inv.keys())).success
    finally:
        a.close()
    done = kvtiers("verify", config)
    assert done.returncode == 0, done.stdout


def _flip(root: Path, key: bytes) -> bool:
    """Flip one bit of `key`'s block bytes in place, if its file is there now."""
    tier_ns = context(model="model-a").namespace.fingerprint
    from kvtiers_fs.disk import layout

    path = root / tier_ns / "blocks" / layout.block_relpath(layout.ident(key))
    try:
        with open(path, "r+b") as f:
            f.seek(4096 + 5)
            byte = f.read(1)
            if len(byte) != 1:
                return False
            f.seek(4096 + 5)
            f.write(bytes([byte[0] ^ 1]))
        return True
    except FileNotFoundError:
        return False
