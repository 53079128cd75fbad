"""Fixtures of the redis tier's tests: real `redis-server` processes (server.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis.helpers import Tiers, tiers_of
from tests.redis.server import RedisServer


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One server for the tests that need nothing of their own (each uses a prefix
    of its own): the conformance suite."""
    server = RedisServer(tmp_path_factory.mktemp("redis-shared"))
    server.start()
    yield server
    server.stop()

@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of the test's own, durable (append-only, fsync always): it may be
    killed and started again, and keeps what it acknowledged."""
    srv = RedisServer(tmp_path / "redis", durable=True)
    srv.start()
    yield srv
    srv.stop()

@pytest.fixture
def tiers(server: RedisServer) -> Iterator[Tiers]:
    """Tiers on the test's own server, closed at the end."""
    yield from tiers_of(server)
