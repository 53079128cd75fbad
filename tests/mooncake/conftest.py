"""Fixtures of the mooncake tier's tests: a network namespace of the session's
own (netns.py: Mooncake's clients listen on 0.0.0.0), and real `mooncake_master`
processes inside it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("mooncake.store", reason="Mooncake's wheel (kvtiers-mooncake[cpu]) "
                    "and Debian's libibverbs1 are needed")

from tests.mooncake import netns
from tests.mooncake.helpers import RawClient, Tiers
from tests.mooncake.master import Master

if netns.available() is not None:
    pytest.skip(str(netns.available()), allow_module_level=True)


@pytest.fixture(scope="session")
def ns() -> Iterator[netns.NetNamespace]:
    space = netns.NetNamespace()
    yield space
    space.delete()


@pytest.fixture(scope="session")
def shared_master(ns: netns.NetNamespace,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    """One master for the tests that need nothing of their own (each uses a prefix
    of its own): the conformance suite."""
    master = Master(ns, tmp_path_factory.mktemp("mooncake-shared"))
    master.start()
    yield master
    master.stop_with_clients()


@pytest.fixture(scope="session")
def shared_raw(ns: netns.NetNamespace, shared_master: Master) -> Iterator[RawClient]:
    """A raw client on the shared master (its close costs Mooncake ~2 s: once)."""
    raw = RawClient(ns, shared_master)
    yield raw
    raw.close()


@pytest.fixture(scope="module")
def master(ns: netns.NetNamespace,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    """A master of the test module's own (a test may kill it and start it again;
    each test uses prefixes of its own)."""
    m = Master(ns, tmp_path_factory.mktemp("mooncake"))
    m.start()
    yield m
    m.stop_with_clients()


@pytest.fixture
def tiers(ns: netns.NetNamespace, master: Master) -> Iterator[Tiers]:
    opened = Tiers(ns, master)
    yield opened
    opened.close_all()
