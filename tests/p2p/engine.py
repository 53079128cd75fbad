"""A real engine's scheduler side for the p2p tests: a CPU pool, a manager and its
p2p tier (with whatever other tiers), serving peers when given a port.

Used by the tests in-process and by `tests.p2p.peer` in child processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvtiers.contract.clock import monotonic
from kvtiers.contract.keys import BlockKey, make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.pool_view import PoolView
from kvtiers.contract.tier import TierContext
from kvtiers.manager import TieringOffloadingManager
from kvtiers.policies.lru import LRUPolicy
from kvtiers.testing import make_namespace
from kvtiers_p2p.tier import P2PTier

BB = 16384
SLOTS = 64
MODEL = "kvtiers-p2p-tests/model"
#: the data plane of test engines that do not name one: ZeroMQ frames (a NIXL
#: agent per engine would cost every test its start-up; tests/p2p/test_nixl.py
#: and the NIXL conformance class ask for "nixl")
PLANE = {"data_plane": "zmq"}
#: timeouts short enough for tests that wait for them
FAST = {"keepalive": {"interval_s": 0.2, "timeout_s": 1.5},
        "reconnect": {"min_s": 0.05, "max_s": 0.5}, "miss_ttl_s": 0.1}


def keys_for(seed: str, n: int) -> list[BlockKey]:
    return [make_key(hashlib.sha256(f"{seed}/{i}".encode()).digest()) for i in range(n)]


def block_data(key: BlockKey, nbytes: int, salt: str = "") -> bytes:
    """Random bytes, the same for a key (and `salt`) in every process (never zeros);
    another `salt` gives other bytes under the same key."""
    return random.Random(key + salt.encode()).randbytes(nbytes)


class Engine:
    """Pool + manager + p2p tier (first in the stack)."""

    def __init__(self, config: dict[str, Any], *, block_bytes: int = BB, slots: int = SLOTS,
                 model: str = MODEL, name: str = "p2p", job_timeout_s: float = 30.0):
        self.pool = PoolView.anonymous(slots, block_bytes)
        ctx = TierContext(self.pool, make_namespace(model, block_bytes), clock=monotonic,
                          name=name)
        self.ctx = dataclasses.replace(ctx, logger=ctx.logger.getChild(name))
        self.tier = P2PTier(self.ctx, {**PLANE, **FAST, **config})
        self.mgr = TieringOffloadingManager(slots, LRUPolicy.for_slots(slots), [self.tier],
                                            job_timeout_s=job_timeout_s, tier_names=[name])
        self.tier.serve_external_requests(self.mgr)

    @property
    def endpoint(self) -> str:
        assert self.tier.server is not None
        return self.tier.server.endpoint

    def store(self, keys: Sequence[BlockKey], salt: str = "") -> dict[BlockKey, bytes]:
        """Store `keys` with their `block_data` into the pool, as a GPU store would."""
        out = self.mgr.prepare_store(keys)
        assert out is not None, "the pool cannot take the blocks"
        data = {}
        for key, slot in zip(out.keys, out.slots, strict=True):
            data[key] = block_data(key, self.pool.block_bytes, salt)
            self.pool.block(slot)[:] = data[key]
        self.mgr.complete_store(keys)
        assert self.mgr.drain(20), "the cascades into the p2p tier did not end"
        return data

    def settle(self, keys: Sequence[BlockKey], timeout: float = 20.0) -> list[LookupResult]:
        """Step and look up until every key is HIT or MISS (bounded by `timeout`,
        real time: a test failure, not a measurement)."""
        end = time.monotonic() + timeout
        while True:
            self.mgr.step()
            answers = [self.mgr.lookup(k) for k in keys]
            if all(a in (LookupResult.HIT, LookupResult.MISS) for a in answers):
                return answers
            if time.monotonic() > end:
                return answers
            time.sleep(0.005)

    def wait_ready(self, timeout: float = 20.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.tier.links and all(link.ready for link in self.tier.links.values()):
                return True
            time.sleep(0.01)
        return False

    def check_loaded(self, keys: Sequence[BlockKey]) -> None:
        """Pin `keys` (all HIT) and assert their bytes are their `block_data`."""
        slots = self.mgr.prepare_load(keys)
        try:
            for key, slot in zip(keys, slots, strict=True):
                assert bytes(self.pool.block(slot)) == block_data(key, self.pool.block_bytes)
        finally:
            self.mgr.complete_load(keys)

    def close(self) -> None:
        self.mgr.close()


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    """True once `condition()` is (polled every 10 ms), False after `timeout` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False
