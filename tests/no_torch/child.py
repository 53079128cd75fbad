"""Run in an interpreter that cannot import torch (see blocker.py): a manager over an
anonymous CpuPool with a `memory` tier and an `fs` tier, built from a config as an
engine builds it, stores random bytes and loads them back; then a second manager over
a fresh pool finds the blocks that left the first one's pool in the fs tier.

`python child.py ROOT` prints a JSON line: what was checked, and which torch-like
modules were imported (none may be)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from kvtiers.config import load_config
from kvtiers.contract.keys import BlockKey, make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.manager import TieringOffloadingManager
from kvtiers.manager.build import build_manager
from kvtiers.pool import CpuPool, pool_shape

GEOMETRY = BlockGeometry(layers=2, kv_heads=2, head_size=64, dtype="float16", tokens_per_block=16)
NAMESPACE = Namespace("test/no-torch", (GEOMETRY,))
BLOCK = GEOMETRY.block_bytes
POOL_SLOTS = 4
BLOCKS = 12  # three pools' worth: most blocks leave the pool and come back from a tier
SLOT, _ = pool_shape(BLOCK, BLOCK)
POOL_BYTES = POOL_SLOTS * SLOT


def wait_for(ready: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.001)


def manager(pool: CpuPool, tiers: list[dict[str, Any]]) -> TieringOffloadingManager:
    doc = {"cpu_bytes_to_use": POOL_BYTES, "secondary_tiers": tiers, "cascade_queue_blocks": 64}
    return build_manager(load_config(doc), pool.view, NAMESPACE)


def store(mgr: TieringOffloadingManager, pool: CpuPool, key: BlockKey, data: bytes) -> None:
    """Store one block as the engine would; the pool frees up as cascades end."""
    out: list[Any] = []

    def prepared() -> bool:
        mgr.step()
        out[:] = [mgr.prepare_store([key])]
        return out[0] is not None

    wait_for(prepared, f"a slot for {key.hex()}")
    [slot] = out[0].slots
    pool.view.block(slot)[:] = data
    mgr.complete_store([key])


def settle(mgr: TieringOffloadingManager) -> None:
    """Step until no block of the pool is held (every cascade to the tiers ended):
    a promotion needs a slot it can free, and answers MISS when there is none."""

    def idle() -> bool:
        mgr.step()
        return bool(mgr.stats()["pool"]["pinned"] == 0)

    wait_for(idle, "the cascades to end")


def load(mgr: TieringOffloadingManager, pool: CpuPool, key: BlockKey) -> bytes:
    """Look the block up until it is readable (promotions land in `step()`), load it."""
    settle(mgr)
    answer: list[LookupResult] = []

    def settled() -> bool:
        mgr.step()
        answer[:] = [mgr.lookup(key)]
        return answer[0] not in (LookupResult.HIT_PENDING, LookupResult.RETRY)

    wait_for(settled, f"the lookup of {key.hex()}")
    if answer[0] is not LookupResult.HIT:
        raise SystemExit(f"block {key.hex()}: {answer[0]}, expected a HIT; {mgr.stats()}")
    [slot] = mgr.prepare_load([key])
    try:
        return bytes(pool.view.block(slot))
    finally:
        mgr.complete_load([key])


def main(root: str) -> None:
    fs = {"type": "fs", "root_dir": root, "capacity_bytes": 64 * 8192,
          "threads": {"load": 1, "store": 1}}  # fmt: skip
    memory = {"type": "memory", "capacity_bytes": 2 * BLOCK, "threads": 1}
    content = {make_key(os.urandom(32), 0): os.urandom(BLOCK) for _ in range(BLOCKS)}
    keys = list(content)

    with CpuPool(BLOCK, POOL_BYTES) as pool:
        mgr = manager(pool, [memory, fs])
        try:
            for key in keys:
                store(mgr, pool, key, content[key])
            wrong = [k.hex() for k in keys if load(mgr, pool, k) != content[k]]
        finally:
            mgr.close()
        pinned = pool.pinned

    # Only the fs tier now, over a fresh pool: every block that had left the first
    # pool (all but the last POOL_SLOTS stored) was written to fs before it could go.
    with CpuPool(BLOCK, POOL_BYTES) as pool:
        mgr = manager(pool, [fs])
        try:
            from_fs = keys[: BLOCKS - POOL_SLOTS]
            wrong += [k.hex() for k in from_fs if load(mgr, pool, k) != content[k]]
        finally:
            mgr.close()

    heavy = sorted(m for m in sys.modules if m.partition(".")[0] in ("torch", "triton"))
    print(json.dumps({"loaded": BLOCKS + len(from_fs), "wrong": wrong, "pinned": pinned,
                      "imported": heavy}))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
