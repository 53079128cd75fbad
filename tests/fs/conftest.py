from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest

# Plain `assert`s in the conformance kit get pytest's detailed failure messages.
pytest.register_assert_rewrite("kvtiers.testing")


@pytest.fixture(scope="session")
def mp() -> Iterator[Any]:
    """A forkserver context: children are forked from a clean, single-threaded
    server with the tier's modules imported, so starting one costs milliseconds."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.fs.child"])
    yield ctx


@pytest.fixture
def children() -> Iterator[list[Any]]:
    """Processes a test starts; killed and reaped at its end, whatever happened."""
    procs: list[Any] = []
    yield procs
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)
