"""The built-in default of `kvtiers bench` (no `--config`): a CPU pool plus an `fs`
tier in a temporary directory that is removed afterwards, and a workload, sized for
a 2-core / 24 GiB machine to finish in well under two minutes while the working set
(48 shared prefixes of 512 tokens, 2 MiB blocks: 3 GiB, plus the sessions' own
turns) is three times the CPU pool, so the pool evicts and `fs` serves hits.

Imports no torch and no tier code (the CLI's `--help` reads these numbers).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from kvtiers.humanize import format_bytes

DEFAULT_CPU_BYTES = 1 << 30
DEFAULT_FS_BYTES = 8 << 30

#: workload options of the default run (and the defaults of every run)
DEFAULT_WORKLOAD: dict[str, int] = {
    "prefixes": 48,
    "prefix_tokens": 512,
    "prompt_tokens": 64,
    "output_tokens": 64,
    "turns": 3,
    "sessions_in_flight": 8,
    "sessions": 240,
    "seed": 0,
}


def default_document(root_dir: str, fs_bytes: int = DEFAULT_FS_BYTES) -> dict[str, Any]:
    return {
        "cpu_bytes_to_use": DEFAULT_CPU_BYTES,
        "eviction_policy": "lru",
        "write_policy": "write_through",
        "secondary_tiers": [
            {"type": "fs", "root_dir": root_dir, "capacity_bytes": fs_bytes, "shared": False}
        ],
    }


@contextlib.contextmanager
def default_root(tmp_dir: str | None = None, need_bytes: int = DEFAULT_FS_BYTES) -> Iterator[str]:
    """A fresh directory for the default `fs` tier (under `tmp_dir`, default the
    system's temporary directory), removed with everything in it afterwards.
    `need_bytes`: what the run may write there (at most the tier's capacity); a
    filesystem with less free space (plus 256 MiB) is refused with an `OSError`."""
    base = os.path.realpath(tmp_dir or tempfile.gettempdir())  # the tier refuses symlinks
    st = os.statvfs(base)
    free = st.f_bavail * st.f_frsize
    need = need_bytes + (256 << 20)
    if free < need:
        raise OSError(
            f"the default fs tier may write {format_bytes(need_bytes)} in {base}, which has "
            f"{format_bytes(free)} free: pass --tmp-dir on a larger filesystem, a smaller "
            "workload, or --config with a tier that fits"
        )
    root = tempfile.mkdtemp(prefix="kvtiers-bench-", dir=base)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def written_bytes_bound(
    prefixes: int,
    prefix_tokens: int,
    sessions: int,
    turns: int,
    tokens_per_turn: int,
    block_tokens: int,
    block_bytes: int,
    file_overhead: int = 8192,
) -> int:
    """The most block bytes (files, with their header and rounding) a run can store:
    every distinct block of the workload once."""
    blocks = prefixes * (prefix_tokens // block_tokens) + sessions * (
        -(-turns * tokens_per_turn // block_tokens)
    )
    return blocks * (block_bytes + file_overhead)
