"""Two NIXL planes in one process, then an ordinary exit:
`python -m tests.p2p.nixl_pair N`.

Plane "b" READs N blocks of random bytes out of plane "a"'s pool (a thread
progresses "a" as a target, as a server's thread does), compares them byte for
byte, both planes close, and the process prints one JSON line {"verified": int,
"wrong": int, "ucx_modules": str | null, "host_rdma": [str]} - `host_rdma`: the
host's rdma-core libraries mapped into the process (libefa, libibverbs,
libnl-route-3 under their own names, not the NIXL wheel's renamed copies) - and
returns from `main`: what the interpreter and the dynamic loader do at exit is
what the test looks at (its exit status).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from kvtiers.contract.pool_view import PoolView
from kvtiers_p2p.wire.nixl_plane import NixlPlane

BB = 16384
_HOST_RDMA = ("libefa.so", "libibverbs.so", "libnl-route-3.so")


def host_rdma_libraries() -> list[str]:
    """The host's rdma-core libraries in this process's memory map."""
    names = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            name = os.path.basename(line.split()[-1])
            if name.startswith(_HOST_RDMA):
                names.add(name)
    return sorted(names)


def main() -> None:
    n = int(sys.argv[1])
    source, target = PoolView.anonymous(n, BB), PoolView.anonymous(n, BB)
    stored = [os.urandom(BB) for _ in range(n)]
    for slot, data in enumerate(stored):
        source.block(slot)[:] = data
        target.block(slot)[:] = os.urandom(BB)  # other bytes where the READ lands
    a, b = NixlPlane(source, "a"), NixlPlane(target, "b")
    stop = threading.Event()

    def progress() -> None:
        while not stop.wait(0.001):
            a.progress()

    thread = threading.Thread(target=progress, daemon=True)
    thread.start()
    try:
        plane = a.descriptor()
        remote = b.connect(plane)
        pairs = [(slot, n - 1 - slot) for slot in range(n)]  # reversed: every slot moves
        end = time.monotonic() + 30
        while (state := b.read(remote, plane, pairs, 5.0)) != "DONE":
            if time.monotonic() > end:  # UCX sets its connection up lazily: retried
                raise RuntimeError(f"the READ never went through: {state}")
            time.sleep(0.05)
        wrong = sum(bytes(target.block(n - 1 - slot)) != data for slot, data in enumerate(stored))
    finally:
        stop.set()
        thread.join(10)
        b.close()
        a.close()
    print(json.dumps({"verified": n - wrong, "wrong": wrong,
                      "ucx_modules": os.environ.get("UCX_MODULES"),
                      "host_rdma": host_rdma_libraries()}), flush=True)


if __name__ == "__main__":
    main()
