"""What `kvtiers inspect`/`verify` ask of a tier, on the `mooncake` tier: its
inventory (this engine's quota), a survey of every namespace under the prefix
from the master's admin listing, and verification with repair of damaged
objects planted by a raw client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvtiers.testing import JobTracker, fill_slots, random_keys, wait_until
from kvtiers_mooncake import record
from kvtiers_mooncake.tier import MooncakeTier

from tests.mooncake.helpers import RawClient, Tiers, context
from tests.mooncake.master import Master
from tests.mooncake.netns import NetNamespace

REPO = Path(__file__).resolve().parents[2]


def test_inventory_survey_and_verify_with_repair(ns: NetNamespace, master: Master,
                                                  tiers: Tiers) -> None:
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=16, admin_address=master.admin_address)
    other = tiers.open(context("another/model"), capacity_blocks=16)
    keys = random_keys(6)
    fill_slots(ctx.pool, range(6))
    assert JobTracker(tier, 30).run_store(keys, range(6)).success
    fill_slots(other.ctx.pool, range(2))
    assert JobTracker(other, 30).run_store(keys[:2], range(2)).success

    inv = tier.inventory()
    assert inv.keys() == set(keys) and inv.committed_bytes == 6 * ctx.block_bytes

    survey = ns.run(MooncakeTier.survey, tier.config)
    by_ns = {n.namespace: n.keys() for n in survey.namespaces}
    assert by_ns == {ctx.namespace.fingerprint: set(keys),
                     other.ctx.namespace.fingerprint: set(keys[:2])}

    # (on the namespace's thread: Mooncake connects to a new peer from the calling thread)
    report = ns.run(tier.verify_blocks)[0]
    assert report.checked == 6 and not report.bad

    raw = RawClient(ns, master)
    try:
        hlen = record.header_bytes(len(keys[0]))
        value = bytearray(raw.get(tier.names.block(keys[0])))
        value[hlen + 100] ^= 0x40
        raw.replace(tier.names.block(keys[0]), bytes(value))
        raw.replace(tier.names.block(keys[1]), b"someone else's bytes" * 100)
        raw.remove(tier.names.block(keys[2]))
        seen: list[tuple[int, int]] = []
        report = ns.run(lambda: tier.verify_blocks(
            progress=lambda done, total: seen.append((done, total))))[0]
        reasons = {b.key: b.reason for b in report.bad}
        assert reasons == {keys[0]: "checksum", keys[1]: "header"}, report
        assert report.vanished == 1 and seen[-1] == (6, 6)
        assert len(tier.index) == 6  # nothing changed without repair
        report = ns.run(lambda: tier.verify_blocks(repair=True))[0]
        assert {b.key for b in report.bad if b.removed} == {keys[0], keys[1]}
        assert set(tier.inventory().keys()) == set(keys[3:])
        assert tier.stats().usage_bytes >= 3 * ctx.block_bytes
        assert raw.get(tier.names.block(keys[1])) == b"someone else's bytes" * 100  # not ours
    finally:
        raw.close()



def test_verify_with_the_admin_listing_covers_other_engines_blocks(
        ns: NetNamespace, master: Master, tiers: Tiers) -> None:
    ctx = context()
    writer = tiers.open(context(), capacity_blocks=8)
    checker = tiers.open(ctx, capacity_blocks=8, admin_address=master.admin_address)
    keys = random_keys(3)
    fill_slots(writer.ctx.pool, range(3))
    assert JobTracker(writer, 30).run_store(keys, range(3)).success
    raw = RawClient(ns, master)
    try:
        name = writer.names.block(keys[1])
        value = bytearray(raw.get(name))
        value[-1] ^= 0x01
        raw.replace(name, bytes(value))
        report = ns.run(lambda: checker.verify_blocks(repair=True))[0]
        assert report.checked == 3, report
        assert [(b.key, b.reason, b.removed) for b in report.bad] == \
            [(keys[1], "checksum", True)]
        assert report.removed_bytes == 0  # not in this engine's quota
        wait_until(lambda: name not in master.names(), "the damaged object removed", 30)
    finally:
        raw.close()


def test_kvtiers_inspect_lists_the_stores_namespaces(tmp_path: Path, ns: NetNamespace,
                                                     master: Master, tiers: Tiers) -> None:
    """The CLI offers the tier (it keeps no index across restarts, but its store can
    be surveyed): `kvtiers inspect --json` shows the blocks this process put."""
    ctx = context()
    tier = tiers.open(ctx, capacity_blocks=8)
    keys = random_keys(4)
    fill_slots(ctx.pool, range(4))
    assert JobTracker(tier, 30).run_store(keys, range(4)).success
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [
        {"type": "mooncake", "master_address": master.address,
         "admin_address": master.admin_address, "capacity_bytes": 1 << 20,
         "prefix": tier.config["prefix"]}]}))
    done = subprocess.run(ns.command(sys.executable, "-m", "kvtiers", "inspect", str(config),
                                     "--json"),
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    (listed,) = json.loads(done.stdout)["tiers"]
    (mine,) = [n for n in listed["namespaces"]
               if n["namespace"] == ctx.namespace.fingerprint]
    assert mine["blocks"] == 4, mine
