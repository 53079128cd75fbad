"""A serving engine in a process of its own: `python -m tests.p2p.peer CONFIG_JSON`.

CONFIG_JSON: {"tier": {...p2p options...}, "seed": str, "n": int,
"block_bytes": int, "model": str, "stall": bool}. It stores `n` blocks
(`keys_for(seed, n)`, `block_data`), prints one JSON line {"endpoint": ...}, and
serves until stdin closes. With "stall", the first fetch a peer makes prints
"FETCH" and blocks the server thread for good (a test kills the process then:
a peer dying mid-transfer).

Each line read meanwhile is a command, answered by one line:
{"restore": {"seed": s, "n": n, "salt": x}}: fill the pool with other blocks until
every block of `keys_for(s, n)` was evicted, then store them again from other
bytes (`block_data(key, nbytes, x)`); "DONE".
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence

from kvtiers.contract.jobs import TransferJob
from kvtiers.contract.keys import BlockKey

from tests.p2p.engine import BB, MODEL, Engine, block_data, keys_for

_TRIES = 2000  # a restore waits this many 10 ms rounds for pullers' pins to go


def main() -> None:
    spec = json.loads(sys.argv[1])
    engine = Engine(spec.get("tier", {"port": 0}), block_bytes=spec.get("block_bytes", BB),
                    model=spec.get("model", MODEL), slots=spec.get("slots", 64))
    engine.store(keys_for(spec.get("seed", "a"), spec.get("n", 8)))
    if spec.get("stall"):
        real = engine.mgr.create_store_job
        never = threading.Event()

        def stall(keys: Sequence[BlockKey]) -> TransferJob | None:
            job = real(keys)
            print("FETCH", flush=True)
            never.wait()
            return job

        engine.mgr.create_store_job = stall  # type: ignore[method-assign]
    print(json.dumps({"endpoint": engine.endpoint}), flush=True)
    for line in sys.stdin:  # until the test closes our stdin (or kills us)
        restore = json.loads(line)["restore"]
        _restore(engine, keys_for(restore["seed"], restore["n"]), restore["salt"])
        print("DONE", flush=True)
    engine.close()


def _restore(engine: Engine, keys: list[BlockKey], salt: str) -> None:
    """Evict `keys` (as many other blocks as the pool has slots: LRU), then store
    them from `salt`'s bytes. A block a puller still pins cannot go yet: retried."""
    fillers = keys_for(f"filler/{salt}", engine.pool.num_slots)
    for _ in range(_TRIES):
        if engine.mgr.prepare_store(fillers) is not None:
            break
        time.sleep(0.01)
    else:
        raise RuntimeError("the pool never let the blocks go")
    engine.mgr.complete_store(fillers)
    assert all(engine.mgr.slot_of(k) is None for k in keys)
    for _ in range(_TRIES):
        if engine.mgr.prepare_store(keys) is not None:
            break
        time.sleep(0.01)
    else:
        raise RuntimeError("the pool cannot take the blocks again")
    for key in keys:
        slot = engine.mgr.slot_of(key)
        assert slot is not None
        engine.pool.block(slot)[:] = block_data(key, engine.pool.block_bytes, salt)
    engine.mgr.complete_store(keys)


if __name__ == "__main__":
    main()
