"""A process for the kill -9 tests of snapshot saves: `python -m tests.ops.save_child
URL SEED BLOCKS POINT` saves BLOCKS random blocks (`blocks(SEED, ...)`) to URL with
`overwrite`, and at POINT prints POINT and waits to be killed:

- `write`: half the blocks written (several chunks on disk), the snapshot unfinished;
- `swap`: every block written and synced, just before the swap into place;
- `swapped`: just after the swap, before the old snapshot is removed;
- `none`: never stops (prints `done` at the end)."""

from __future__ import annotations

import random
import sys
import time
from typing import Any

from kvtiers.ops.snapshot_store import SnapshotWriter
from kvtiers.sdk import checksum
from kvtiers.testing import make_namespace

BLOCK_BYTES = 1 << 18  # 32 rows a chunk: a few chunks in a few MiB
NAMESPACE = make_namespace("model-a", BLOCK_BYTES)


def blocks(seed: int, n: int) -> list[tuple[bytes, bytes]]:
    """(key, bytes) of `n` random blocks, the same for a seed in every process."""
    rng = random.Random(seed)
    return [(rng.randbytes(24), rng.randbytes(BLOCK_BYTES)) for _ in range(n)]


def save(url: str, seed: int, n: int, *, overwrite: bool = False, stop: Any = None,
         storage_options: dict[str, Any] | None = None) -> None:
    """`blocks(seed, n)` saved at `url`; `stop()` called once half are written."""
    with SnapshotWriter(url, NAMESPACE, BLOCK_BYTES, overwrite=overwrite,
                        storage_options=storage_options) as writer:
        for i, (key, data) in enumerate(blocks(seed, n)):
            writer.add(key, checksum(data), data)
            if stop is not None and i == n // 2:
                stop()
        writer.close()


def _halt(point: str) -> None:
    print(point, flush=True)
    while True:
        time.sleep(60)


def main() -> None:
    from kvtiers.ops import snapshot_target

    url, seed, n, point = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    real = snapshot_target._exchange

    def exchange(a: str, b: str) -> bool:
        if point == "swap":
            _halt(point)
        swapped = real(a, b)
        if point == "swapped":
            assert swapped, "this filesystem cannot exchange two directories"
            _halt(point)
        return swapped

    snapshot_target._exchange = exchange
    save(url, seed, n, overwrite=True,
         stop=(lambda: _halt(point)) if point == "write" else None)
    print("done", flush=True)


if __name__ == "__main__":
    main()
