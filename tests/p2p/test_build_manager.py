"""`build_manager` hands a peer-serving tier its manager (the contract's
`serve_external_requests`), so an engine building its stack from a config serves its
pool to peers with no extra call: a second engine pulls a block from it, verified."""

from __future__ import annotations

import os
import socket
import time

from kvtiers import TieringOffloadingManager, build_manager, load_config
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.pool_view import PoolView
from kvtiers.testing import make_namespace

from tests.p2p.engine import BB, FAST, SLOTS


def _engine(tier: dict[str, object]) -> tuple[PoolView, TieringOffloadingManager]:
    config = load_config({
        "cpu_bytes_to_use": SLOTS * BB,
        "secondary_tiers": [{"type": "p2p", "host": "127.0.0.1", **FAST, **tier}],
    })  # fmt: skip
    pool = PoolView.anonymous(SLOTS, BB)
    return pool, build_manager(config, pool, make_namespace("test/p2p-build", BB))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_built_manager_serves_its_pool_to_peers() -> None:
    port = _free_port()
    pool_a, a = _engine({"port": port})
    try:
        endpoint = f"tcp://127.0.0.1:{port}"
        key = os.urandom(32) + b"\0\0\0\0"
        data = os.urandom(BB)
        out = a.prepare_store([key])
        assert out is not None
        pool_a.block(out.slots[0])[:] = data
        a.complete_store(out.keys)

        pool_b, b = _engine({"peers": [endpoint]})
        try:
            result = LookupResult.RETRY
            deadline = time.monotonic() + 60  # a bound for a loaded machine, not a timing
            while result is not LookupResult.HIT and time.monotonic() < deadline:
                result = b.lookup(key)  # connect, probe, then promote, over steps
                b.drain(0.05)
                time.sleep(0.01)
            assert result is LookupResult.HIT
            (slot,) = b.prepare_load([key])
            assert bytes(pool_b.block(slot)) == data
            b.complete_load([key])
        finally:
            b.close()
    finally:
        a.close()
