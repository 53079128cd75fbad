#!/usr/bin/env python3
"""vLLM's obj tier's data path - NIXL's OBJ backend, as vLLM 0.33's
`ObjectStoreSecondaryTierManager` drives it (one NIXL transfer per job over DRAM
descriptors, `num_threads` = io_threads) - timed against an S3 server, for
bench/s3_bench.py. Imports no kvtiers code; needs `nixl_cu12` (pip install
nixl-cu12; its OBJ plugin loads on a CPU-only machine) and numpy.

    python bench/nixl_obj_bench.py '{"endpoint": "127.0.0.1:8333", "bucket": ..., ...}'

Prints one JSON line: seconds for the store pass and the load pass, the latency of
each job (submit to done), and whether the bytes read back are the bytes written.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from typing import Any


def main() -> int:
    import numpy as np
    from nixl_cu12._api import nixl_agent, nixl_agent_config

    cfg: dict[str, Any] = json.loads(sys.argv[1])
    bb, n, per_job = int(cfg["block_bytes"]), int(cfg["blocks"]), int(cfg["job_blocks"])
    agent = nixl_agent("ObjAgent", nixl_agent_config(backends=[]))
    agent.create_backend("OBJ", {
        "bucket": cfg["bucket"], "endpoint_override": cfg["endpoint"], "scheme": "http",
        "access_key": cfg["key"], "secret_key": cfg["secret"],
        "num_threads": str(cfg["threads"])})
    buf = bytearray(os.urandom(bb * n)) + bytearray(bb * n)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    reg = agent.register_memory([(base, len(buf), 0, "")], "DRAM")
    dram = agent.prep_xfer_dlist("NIXL_INIT_AGENT",
                                 [(base + i * bb, bb, 0) for i in range(2 * n)], "DRAM")
    names = [f"{cfg['prefix']}/{os.urandom(16).hex()}.bin" for _ in range(n)]
    dev = iter(range(1, 1 << 30))

    def run(op: str, first_slot: int) -> tuple[float, list[float]]:
        handles = []
        start = time.perf_counter()
        for j in range(0, n, per_job):
            keys = names[j:j + per_job]
            files = agent.register_memory([(0, bb, next(dev), k) for k in keys], "OBJ")
            obj = agent.prep_xfer_dlist("ObjAgent", files.trim())
            ids = np.arange(first_slot + j, first_slot + j + len(keys), dtype=np.int32)
            x = agent.make_prepped_xfer(op, dram, ids, obj,
                                        np.arange(len(keys), dtype=np.int32))
            if agent.transfer(x) == "ERR":
                raise RuntimeError(f"{op} failed")
            handles.append((x, obj, files))
        latencies: list[float] = []
        left = list(handles)
        while left:
            for h in list(left):
                state = agent.check_xfer_state(h[0])
                if state == "PROC":
                    continue
                if state != "DONE":
                    raise RuntimeError(f"{op} ended {state}")
                latencies.append(time.perf_counter() - start)
                left.remove(h)
            time.sleep(0.0005)
        seconds = time.perf_counter() - start
        for x, obj, files in handles:
            agent.release_xfer_handle(x)
            agent.release_dlist_handle(obj)
            agent.deregister_memory(files)
        return seconds, latencies

    store = run("WRITE", 0)
    load = run("READ", n)
    ok = buf[:bb * n] == buf[bb * n:]
    agent.release_dlist_handle(dram)
    agent.deregister_memory(reg)
    print(json.dumps({"store": store, "load": load, "match": ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
