"""`kvtiers inspect` and `kvtiers verify` on a redis tier, as a user runs them: every
namespace under the prefix listed (ours and another model's, with model, geometry,
blocks and bytes) without changing anything; damaged blocks found by reason and,
with `--repair`, removed through the tier's accounting (a value whose header, key or
length is wrong is deleted by the tier's start-up scan already, and said so) - the
good ones still served byte for byte."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from kvtiers.testing import JobTracker, check_blocks, fill_slots, poison_slots, random_keys

from tests.clirun import run_kvtiers
from tests.redis.helpers import BLOCK, Tiers, context
from tests.redis.server import RedisServer

REPO = Path(__file__).resolve().parents[2]


def kvtiers(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m kvtiers ARGS` in a process of its own (tests/clirun.py)."""
    return run_kvtiers(args, cwd=REPO, timeout=300)


def _config(path: Path, server: RedisServer, prefix: str) -> str:
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "model": "model-a",
                                "secondary_tiers": [{"type": "redis", "url": server.url,
                                                     "prefix": prefix,
                                                     "capacity_bytes": 64 * BLOCK}]}))
    return str(path)


def _dump(server: RedisServer) -> dict[bytes, Any]:
    with server.client() as raw:
        return {n: raw.dump(n) for n in raw.scan_iter(count=1000)}


def test_inspect_and_verify_with_repair(server: RedisServer, tiers: Tiers,
                                        tmp_path: Path) -> None:
    a_ctx, b_ctx = context("model-a"), context("model-b")
    a = tiers.open(a_ctx, capacity_blocks=64)
    b = tiers.open(b_ctx, capacity_blocks=64)
    keys = random_keys(10)
    data = fill_slots(a_ctx.pool, range(10))
    assert JobTracker(a).run_store(keys, range(10)).success
    fill_slots(b_ctx.pool, range(3))
    assert JobTracker(b).run_store(keys[:3], range(3)).success
    a.close()
    b.close()
    config = _config(tmp_path / "c.json", server, tiers.prefix)

    before = _dump(server)
    done = kvtiers("inspect", config, "--json")
    assert done.returncode == 0, done.stderr
    assert _dump(server) == before, "inspect changed the server's data"
    (tier,) = json.loads(done.stdout)["tiers"]
    by_fp = {ns["namespace"]: ns for ns in tier["namespaces"]}
    fp_a, fp_b = a_ctx.namespace.fingerprint, b_ctx.namespace.fingerprint
    assert set(by_fp) == {fp_a, fp_b}
    ours, other = by_fp[fp_a], by_fp[fp_b]
    assert ours["ours"] and not other["ours"]
    assert (ours["model"], other["model"]) == ("model-a", "model-b")
    assert ours["geometry"][0]["head_size"] == BLOCK // 2
    assert (ours["blocks"], ours["committed_bytes"]) == (10, 10 * BLOCK)
    assert (other["blocks"], other["committed_bytes"]) == (3, 3 * BLOCK)
    assert ours["capacity_bytes"] == 64 * BLOCK and "127.0.0.1" in ours["location"]

    raw = server.client()
    damaged = keys[1:4]
    for key in damaged:  # one bit of the block's bytes
        name = a.names.block(key)
        value = raw.get(name)
        assert isinstance(value, bytes)
        raw.setrange(name, len(value) - 777, bytes([value[-777] ^ 0x10]))
    flipped = {k: raw.get(a.names.block(k)) for k in damaged}
    cut = raw.get(a.names.block(keys[4]))
    assert isinstance(cut, bytes)
    raw.set(a.names.block(keys[4]), cut[:-100])  # the tier's start-up scan deletes it
    done = kvtiers("verify", config, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    reports = {ns["namespace"]: ns for ns in json.loads(done.stdout)["tiers"][0]["namespaces"]}
    assert {x["key"]: x["reason"] for x in reports[fp_a]["bad"]} == {
        k.hex(): "checksum" for k in damaged}
    assert reports[fp_a]["checked"] == 9 and not any(x["removed"] for x in reports[fp_a]["bad"])
    assert reports[fp_b]["ok"]
    assert {k: raw.get(a.names.block(k)) for k in damaged} == flipped  # untouched
    assert reports[fp_a]["notes"] == [
        "1 damaged value(s) (bad header, key or length) were deleted when the tier opened"]
    assert not raw.exists(a.names.block(keys[4]))

    done = kvtiers("verify", config, "--repair", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    ns = {n["namespace"]: n for n in json.loads(done.stdout)["tiers"][0]["namespaces"]}[fp_a]
    assert all(x["removed"] for x in ns["bad"]) and ns["removed_bytes"] == 3 * BLOCK
    human = kvtiers("verify", config)
    assert human.returncode == 0, human.stdout + human.stderr
    assert [raw.exists(a.names.block(k)) for k in damaged] == [0, 0, 0]
    raw.close()

    ctx = context("model-a")
    tier = tiers.open(ctx, capacity_blocks=64)
    good = [k for k in keys if k not in damaged and k != keys[4]]
    assert tier.inventory().keys() == set(good)
    assert tier.stats().usage_bytes == len(good) * BLOCK
    poison_slots(ctx.pool, range(len(good)))
    assert JobTracker(tier).run_load(good, range(len(good))).success
    check_blocks(ctx.pool, [(i, data[keys.index(k)]) for i, k in enumerate(good)])


def test_snapshot_save_and_load_move_a_redis_tiers_blocks(server: RedisServer, tiers: Tiers,
                                                          tmp_path: Path) -> None:
    """`kvtiers snapshot save` of one prefix and `load` into another: every block back
    byte for byte (the tier's inventory and stores are all the command needs)."""
    ctx = context("model-a")
    source = tiers.open(ctx, capacity_blocks=64)
    keys = random_keys(12)
    data = fill_slots(ctx.pool, range(12))
    assert JobTracker(source).run_store(keys, range(12)).success
    source.close()
    snap = str(tmp_path / "warm.zarr")
    done = kvtiers("snapshot", "save", _config(tmp_path / "a.json", server, tiers.prefix),
                   snap, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["blocks"] == 12
    done = kvtiers("snapshot", "load", _config(tmp_path / "b.json", server, "copy"), snap,
                   "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["blocks"] == 12
    copy = Tiers(server, "copy")
    try:
        ctx = context("model-a")
        tier = copy.open(ctx, capacity_blocks=64)
        assert copy.stored(tier) == set(keys)
        poison_slots(ctx.pool, range(12))
        assert JobTracker(tier).run_load(keys, range(12)).success
        check_blocks(ctx.pool, list(enumerate(data)))
    finally:
        copy.close_all()
