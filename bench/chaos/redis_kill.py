"""redis: the Redis server killed with SIGKILL mid-run, then restarted.

The tests' server (`tests/redis/server.py`: `redis-server` on a free loopback
port, durable - append-only, fsync always - so a restarted server keeps every
write it acknowledged) and the example redis tier (`examples/kvtiers-redis`,
`timeout_s` 2), driven as `s3_kill` drives the s3 tier: random blocks stored and
loaded back without pause, the server killed at a random instant and started
again (same port, same directory) after `down_s`. Jobs fail (`io`, `timeout`)
while it is away and must never hang; `recovery_s` runs from the server answering
again to the end of the first job submitted after that which succeeded whole. At
the end every block the tier reported stored must load with its bytes, and its
usage must equal the block bytes of the values the server holds under its
namespace (a raw SCAN; each value's header left out), at once or, noted as a
finding, in a tier opened again (a SET past its deadline may be applied later).
Skipped when kvtiers-redis, redis-py or a `redis-server` binary is missing."""

from __future__ import annotations

import contextlib
import importlib.util
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.chaos.driver import Driver, open_tier
from bench.chaos.report import Row
from bench.chaos.s3_kill import outage

NAME = "redis-server-kill"
BLOCK = 64 << 10
PREFIX = "chaos"
#: outages, batches stored before each, seconds the server is away
PROFILES: dict[str, dict[str, Any]] = {
    "short": {"outages": 2, "warm": 6, "down_s": 1.0},
    "long": {"outages": 8, "warm": 40, "down_s": 3.0},
}
#: a value's header before the block bytes: 70 bytes and the key
#: (`kvtiers_redis.record`, documented there)
HEADER_FIXED = 70


def run(profile: str, workdir: Path, seed: int) -> list[Row]:
    return run_outages(NAME, PROFILES[profile], workdir, seed, freeze=False)


def missing() -> str:
    """Why the redis scenarios cannot run here ("" when they can)."""
    for module, what in (("kvtiers_redis", "kvtiers-redis (examples/kvtiers-redis)"),
                         ("redis", "redis-py")):
        if importlib.util.find_spec(module) is None:
            return f"{what} is not installed"
    from tests.redis.server import find_binary

    try:
        find_binary()
    except RuntimeError as exc:
        return str(exc)
    return ""


@contextlib.contextmanager
def durable_server(directory: Path) -> Iterator[Any]:
    """The tests' durable `RedisServer` in `directory`, running; killed at the end."""
    from tests.redis.server import RedisServer

    server = RedisServer(directory, durable=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def redis_tier(server: Any, **options: Any) -> Any:
    return open_tier({"type": "redis", "url": server.url, "capacity_bytes": 1 << 30,
                      "prefix": PREFIX, "timeout_s": 2, **options}, "chaos-redis", BLOCK)


def run_outages(name: str, p: dict[str, Any], workdir: Path, seed: int,
                freeze: bool) -> list[Row]:
    """The scenario with the profile `p`: kill -9 and restart, or (`freeze`)
    SIGSTOP and SIGCONT."""
    row = Row(name)
    why = missing()
    if why:
        row.skipped = why
        return [row]
    rng = random.Random(seed)
    with durable_server(workdir / name) as server:
        tier = redis_tier(server)
        drive = Driver(tier, row)
        try:
            for _ in range(p["outages"]):
                outage(p, server, rng, drive, row, freeze)
                row.rounds += 1
            drive.check_all()
            row.usage_bytes = tier.stats().usage_bytes
            row.store_bytes = held_bytes(server, tier.ctx.namespace.fingerprint)
        finally:
            tier.close()
        if row.usage_bytes != row.store_bytes:
            _after_restart(server, row)
    return [row]


def _after_restart(server: Any, row: Row) -> None:
    """Usage against the server once more, by a tier opened again (its start-up
    SCAN adopts every value of ours): values the server applied after their
    request's deadline (a SET sent before a freeze) hold bytes the running tier
    never counted - noted as a finding, and measured here."""
    row.notes.append(f"TIER FINDING: usage {row.usage_bytes} B but the server holds "
                     f"{row.store_bytes} B of blocks: a store that failed its deadline "
                     "was applied later, outside the tier's accounting (and its capacity) "
                     "until its next start")
    tier = redis_tier(server)
    try:
        row.usage_bytes = tier.stats().usage_bytes
        row.store_bytes = held_bytes(server, tier.ctx.namespace.fingerprint)
    finally:
        tier.close()
    row.notes.append(f"a tier opened again counts {row.usage_bytes} B")


def held_bytes(server: Any, fingerprint: str) -> int:
    """The block bytes of the values under the tier's block names, by a raw SCAN
    (each value's length less its header)."""
    head = f"{PREFIX}:{fingerprint}:b:".encode()
    total = 0
    with server.client() as raw:
        for name in raw.scan_iter(match=head + b"*", count=1000):
            key_bytes = (len(name) - len(head)) // 2  # the key, in hex
            total += int(raw.strlen(name)) - HEADER_FIXED - key_bytes
    return total
