"""A serving engine in a process of its own: `python -m tests.p2p.peer CONFIG_JSON`.

CONFIG_JSON: {"tier": {...p2p options...}, "seed": str, "n": int,
"block_bytes": int, "model": str, "stall": bool}. It stores `n` blocks
(`keys_for(seed, n)`, `block_data`), prints one JSON line {"endpoint": ...}, and
serves until stdin closes. With "stall", the first fetch a peer makes prints
"FETCH" and blocks the server thread for good (a test kills the process then:
a peer dying mid-transfer).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Sequence

from kvtiers.jobs import TransferJob
from kvtiers.keys import BlockKey

from tests.p2p.engine import BB, MODEL, Engine, keys_for


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
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    engine.close()


if __name__ == "__main__":
    main()
