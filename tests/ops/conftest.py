"""Fixtures for the ops tests: child processes (a forkserver with the fs tier's
test children preloaded) killed and reaped at the end, and `kvtiers` as a user
runs it."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.clirun import run_kvtiers

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mp() -> Iterator[Any]:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.fs.child"])
    yield ctx


@pytest.fixture
def children() -> Iterator[list[Any]]:
    procs: list[Any] = []
    yield procs
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)


def kvtiers(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m kvtiers ARGS` in a process of its own (tests/clirun.py)."""
    return run_kvtiers(args, cwd=REPO, timeout=timeout)


def fs_config(path: Path, roots: list[str] | str, capacity_bytes: int,
              model: str | None = "model-a", **more: Any) -> str:
    tier = {"type": "fs", "root_dir": roots, "capacity_bytes": capacity_bytes, **more}
    doc: dict[str, Any] = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [tier]}
    if model is not None:
        doc["model"] = model
    path.write_text(json.dumps(doc))
    return str(path)
