"""A fresh SGLang rank's storage backend in a process of its own (the two-process
test): `python -m tests.sglang.peer_process ROOT SEED PAGES MODEL OTHER_MODEL`.

The pages and keys are those `pages_of(SEED, PAGES)` gives (random bytes and random
page keys). It builds a backend of MODEL on the fs root ROOT, asks how many of the
pages exist, loads them into other host pages, then does the same as OTHER_MODEL,
and prints JSON: `{MODEL: {"found": n, "loaded": [...], "same": [...]}, OTHER_MODEL:
{...}}` (`same`: the loaded page holds exactly the bytes of `pages_of`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from tests.sglang.harness import extra_config, fs_tier, make_backend, page_keys
from tests.sglang.host_pool import HostPool


def pages_of(seed: int, n: int) -> tuple[list[str], HostPool, list[bytes]]:
    """Page keys, a host pool whose pages 0..n-1 hold random bytes, those bytes."""
    gen = torch.Generator().manual_seed(seed)
    keys = page_keys(gen, n)
    pool = HostPool(pages=2 * n)
    pool.fill_random(gen)
    return keys, pool, [pool.page_bytes(p) for p in range(n)]


def read(root: Path, seed: int, n: int, model: str) -> dict[str, Any]:
    keys, pool, stored = pages_of(seed, n)
    pool.fill_random(torch.Generator().manual_seed(seed + 1))
    backend, _ = make_backend(extra_config([fs_tier(root)], exists_wait_s=5.0), pool, model=model)
    found = backend.batch_exists(keys)
    targets = list(range(n, 2 * n))
    loaded = backend.batch_get_v1(keys, pool.indices(targets))
    same = [pool.page_bytes(t) == s for t, s in zip(targets, stored, strict=True)]
    backend.close()
    return {"found": found, "loaded": loaded, "same": same}


def main(argv: list[str]) -> None:
    root, seed, pages, model, other = argv
    print(json.dumps({m: read(Path(root), int(seed), int(pages), m) for m in (model, other)}))


if __name__ == "__main__":
    main(sys.argv[1:])
