"""p2p: a `kvtiers serve` cache node killed with SIGKILL, or frozen (SIGSTOP), while
an engine's p2p tier pushes blocks into it and pulls them back.

The node is the tests' (`tests/p2p/nodes.py`: `kvtiers serve` in a process of its
own, waited for by its ready file) on a fixed loopback port, with a CPU pool large
enough that it never evicts; the puller is a p2p tier (`push`, ZeroMQ data plane,
the tests' short keep-alives and reconnects) driven as `s3_kill` drives its tier:
random blocks stored (pushed to the node) and loaded back (pulled) without pause
while the node is killed and started again on the same port after `down_s`, or
frozen and continued. Jobs fail while it is away and must never hang;
`recovery_s` runs from the node serving again to the end of the first store
submitted after that which succeeded whole.

A node is a cache of its pool: one killed comes back empty. After each kill every
block stored so far is asked for once: those it still serves must be right, the
rest are dropped from the books (errors `gone-with-node`, not losses); after the
last round a few batches more are stored, and every block then in the books must
load with its bytes (lost 0). A frozen node keeps its pool: every block stored
must load. Usage: the puller's (the node's pool, as its last store answer said)
against the blocks resident in the node's pool as the node itself reports when
stopped (SIGTERM). Skipped when kvtiers-p2p (or pyzmq) is not installed."""

from __future__ import annotations

import importlib.util
import random
import re
import signal
from pathlib import Path
from typing import Any

from kvtiers.sdk import FailureReason

from bench.chaos.driver import Driver, open_tier
from bench.chaos.report import Row
from bench.chaos.s3_kill import outage

NAME = "p2p-node-kill"
FREEZE_NAME = "p2p-node-freeze"
BLOCK = 16384
MODEL = "kvtiers-chaos/p2p"
POOL = 256 << 20  # the node's pool: more than any profile stores (it never evicts)
#: outages, batches stored before each, seconds the node is away (or frozen)
PROFILES: dict[str, dict[str, Any]] = {
    "short": {"outages": 2, "warm": 6, "down_s": 1.0, "freeze": [4.0]},
    "long": {"outages": 6, "warm": 40, "down_s": 3.0, "freeze": [4.0, 8.0, 8.0]},
}


class NodeServer:
    """A `tests.p2p.nodes.Node` that can be killed and started again on one port,
    and paused: what `s3_kill.outage` drives."""

    def __init__(self, workdir: Path):
        from tests.s3.servers import free_port  # (stdlib only)

        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.node: Any = None
        self.start()

    def start(self) -> None:
        from tests.p2p.engine import FAST  # keep-alives and reconnects of a second or so
        from tests.p2p.nodes import Node

        config = {"cpu_bytes_to_use": POOL,
                  "secondary_tiers": [{"type": "p2p", "port": self.port, **FAST}]}
        # no status lines: nobody reads the node's stdout until it ends
        self.node = Node(config, self.dir, "--status-every", "0", model=MODEL,
                         block_bytes=BLOCK)
        self.proc = self.node.proc

    def kill(self) -> None:
        self.node.kill()

    def pause(self) -> None:
        self.node.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.node.proc.send_signal(signal.SIGCONT)

    def stop(self) -> str:
        """SIGTERM (SIGCONT first, should it be frozen); what it printed."""
        if self.node.proc.poll() is not None:
            return ""
        self.resume()
        code, out, err = self.node.terminate()
        return out if code == 0 else f"exit {code}: {err[-2000:]}"


def _missing() -> str:
    for module, what in (("kvtiers_p2p", "kvtiers-p2p"), ("zmq", "pyzmq")):
        if importlib.util.find_spec(module) is None:
            return f"{what} is not installed"
    return ""


def run(profile: str, workdir: Path, seed: int) -> list[Row]:
    return run_node(NAME, PROFILES[profile], workdir, seed, freeze=False)


def run_node(name: str, p: dict[str, Any], workdir: Path, seed: int,
             freeze: bool) -> list[Row]:
    row = Row(name)
    why = _missing()
    if why:
        row.skipped = why
        return [row]
    from tests.p2p.engine import FAST

    rng = random.Random(seed)
    server = NodeServer(workdir / name)
    try:
        tier = open_tier({"type": "p2p", "peers": [server.endpoint], "push": True,
                          "data_plane": "zmq", **FAST}, MODEL, BLOCK)
        drive = Driver(tier, row, timeout_s=60)
        try:
            outages = [{**p, "down_s": s} for s in p["freeze"]] if freeze else \
                [p] * p["outages"]
            for q in outages:
                outage(q, server, rng, drive, row, freeze)
                if not freeze:
                    _sweep(drive)
                row.rounds += 1
            for _ in range(p["warm"]):
                drive.store()
            drive.check_all()
            row.usage_bytes = tier.stats().usage_bytes
        finally:
            tier.close()
        said = server.stop()
    finally:
        server.kill()
    found = re.findall(r"pool (\d+)/\d+ blocks", said)
    if found:
        row.store_bytes = int(found[-1]) * BLOCK
    else:
        row.problems.append(f"the node did not say what its pool holds: {said[-800:]}")
    return [row]


def _sweep(drive: Driver) -> None:
    """Every block in the books asked for once after a kill: the node came back
    empty, so those it no longer serves leave the books (`gone-with-node`); those it
    serves are checked (by `Driver.load`)."""
    keys = list(drive.stored)
    for i in range(0, len(keys), drive.batch):
        result = drive.load(keys[i:i + drive.batch])
        for key, reason in result.failed.items():
            if reason is FailureReason.MISSING:
                drive.stored.pop(key, None)
                drive.row.errors["gone-with-node"] += 1
