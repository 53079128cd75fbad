"""Helpers for the bench tests: `kvtiers bench` as a subprocess, tiny workloads, and
configs built around a test's temporary directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.clirun import run_kvtiers

REPO = Path(__file__).resolve().parents[2]
BLOCK = 8192  # the `tiny` preset's block: 2 layers x K,V x 16 tokens x 2 heads x 32 x bf16

# A few seconds of work: 4 prefixes of 8 blocks, 24 sessions of 3 short turns.
TINY = [
    "--model",
    "tiny",
    "--prefixes",
    "4",
    "--prefix-tokens",
    "128",
    "--prompt-tokens",
    "32",
    "--output-tokens",
    "32",
    "--turns",
    "3",
    "--sessions-in-flight",
    "4",
    "--sessions",
    "24",
    "--no-progress",
]


def kvtiers(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m kvtiers ARGS` in a process of its own (tests/clirun.py)."""
    return run_kvtiers(args, cwd=REPO, timeout=timeout)


def write_config(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def small_pool(slots: int = 64) -> int:
    """A CPU pool too small for the tiny workload, so tiers below it serve hits."""
    return slots * BLOCK


@pytest.fixture
def ram_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs (/dev/shm) where there is one, else `tmp_path`: an fs
    tier there writes to memory, which no disk can hold up. On a disk, a store waits
    for the device (O_DIRECT), and a device busy writing back what another process
    wrote (CI writes a whole venv just before the tests) holds every store of a
    one-second run until after its last request - the tier then serves nothing,
    correctly, and a test that wants fs hits learns nothing about the report."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="kvtiers-bench-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
