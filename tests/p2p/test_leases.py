"""Leases: a NIXL lookup pins what the server holds and says where, and the load
READs it with no fetch round trip. `Leases` alone (the puller's book-keeping),
then a real server spoken to by hand (pins, budget, timeouts), then two real
engines (the load under the lease, bytes compared; a lapsed lease, a block changed
under its lease, a fetch that needs the budget the leases hold)."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.sdk.integrity import checksum
from kvtiers_p2p.pull.leases import USE_SHARE, Leases
from kvtiers_p2p.wire.codec import encode
from kvtiers_p2p.wire.nixl_plane import nixl_available
from kvtiers_p2p.wire.protocol import Abort, DataPlane, Landed, Lookup, LookupReply, State, Welcome

from tests.p2p.conftest import MakeEngine
from tests.p2p.engine import Engine, block_data, keys_for, wait_for
from tests.p2p.test_server import RawPeer, pinned, wait_unpinned

needs_nixl = pytest.mark.skipif(not nixl_available(), reason="NIXL does not import here "
                                "(pip install 'kvtiers-p2p[nixl]')")
HIT = LookupResult.HIT
NIXL = {"data_plane": "nixl"}
P, A = State.PRESENT, State.ABSENT


# The puller's book-keeping.

def _reply(req: int, states: list[int], first_slot: int = 0, lease_s: float = 2.0
           ) -> LookupReply:
    held = states.count(P)
    return LookupReply(req, bytes(states), lease_s, list(range(first_slot, first_slot + held)),
                       [1000 + first_slot + j for j in range(held)])


def test_a_load_of_what_one_lookup_leased_takes_it_whole() -> None:
    leases, keys = Leases(), keys_for("l", 4)
    assert leases.grant(_reply(1, [P] * 4, first_slot=10), keys, sent_at=100.0) == []
    assert leases.blocks == 4 and len(leases) == 1
    taken = leases.take(tuple(keys), now=100.1)  # any sequence of the same keys
    assert taken is not None and taken.at is None
    assert taken.slots == [10, 11, 12, 13] and taken.sums == [1010, 1011, 1012, 1013]
    assert leases.take(keys, now=100.1) is None  # read under a lease once: then fetched
    assert leases.blocks == 4  # held until the load ends
    assert leases.finish(taken.leases) == [1]
    assert leases.blocks == 0 and len(leases) == 0 and leases.take(keys, 100.2) is None


def test_a_load_of_what_several_lookups_leased_in_order_takes_them_whole() -> None:
    leases, keys = Leases(), keys_for("w", 6)
    leases.grant(_reply(1, [P], first_slot=30), keys[:1], sent_at=0.0)
    leases.grant(_reply(2, [P] * 5, first_slot=40), keys[1:], sent_at=0.0)
    taken = leases.take(keys, now=0.1)
    assert taken is not None and taken.at is None
    assert taken.slots == [30, 40, 41, 42, 43, 44] and [x.req for x in taken.leases] == [1, 2]
    assert taken.sums == [1030, 1040, 1041, 1042, 1043, 1044]
    assert sorted(leases.finish(taken.leases)) == [1, 2] and leases.blocks == 0


def test_loads_share_a_lease_and_it_ends_with_the_last_of_them() -> None:
    leases = Leases()
    a, b = keys_for("a", 3), keys_for("b", 2)
    leases.grant(_reply(1, [P, A, P], first_slot=0), a, sent_at=0.0)  # a[1] absent
    leases.grant(_reply(2, [P, P], first_slot=5), b, sent_at=0.0)
    first = leases.take([b[1], a[1], a[0], keys_for("c", 1)[0]], now=1.0)
    assert first is not None and first.at == [0, 2]  # b[1] and a[0]
    assert first.slots == [6, 0] and first.sums == [1006, 1000]
    assert sorted(lease.req for lease in first.leases) == [1, 2]
    second = leases.take([a[2], b[0], a[0]], now=1.0)  # a[0] was read already
    assert second is not None and second.at == [0, 1] and second.slots == [1, 5]
    assert leases.finish(first.leases) == []  # the second load still reads under them
    assert leases.blocks == 4
    assert sorted(leases.finish(second.leases)) == [1, 2] and leases.blocks == 0
    assert leases.unused == 0


def test_a_lease_is_used_for_three_quarters_of_its_time_then_given_back() -> None:
    leases, keys = Leases(), keys_for("t", 2)
    leases.grant(_reply(3, [P, P], lease_s=2.0), keys, sent_at=10.0)
    end = 10.0 + 2.0 * USE_SHARE
    assert leases.expired(end - 0.01) == []
    assert leases.take(keys, now=end) is None  # not used past its share of the time
    assert leases.expired(end) == [3] and leases.expired(end + 1) == []
    assert leases.blocks == 0 and leases.unused == 1


def test_a_lease_read_under_is_given_back_only_once_its_loads_end() -> None:
    leases, keys = Leases(), keys_for("u", 3)
    leases.grant(_reply(4, [P] * 3), keys, sent_at=0.0)
    taken = leases.take(keys[:2], now=0.1)  # one key left
    assert taken is not None and taken.at == [0, 1]
    assert leases.expired(100.0) == [] and leases.idle(10) == []
    assert leases.finish(taken.leases) == []  # a key left: kept for a load of it
    assert leases.expired(100.0) == [4] and leases.unused == 1


def test_idle_leases_give_back_the_oldest_first_until_enough_is_free() -> None:
    leases = Leases()
    for req in (1, 2, 3):
        leases.grant(_reply(req, [P] * 4, first_slot=req * 10), keys_for(f"i{req}", 4), 0.0)
    assert leases.blocks == 12
    assert leases.idle(5) == [1, 2]  # 4 blocks were not enough
    assert leases.blocks == 4 and leases.idle(0) == []
    assert leases.take(keys_for("i1", 4), now=0.1) is None  # given back: fetched
    assert leases.take(keys_for("i3", 4), now=0.1) is not None


def test_a_key_leased_again_is_the_newest_leases() -> None:
    leases, keys = Leases(), keys_for("n", 2)
    leases.grant(_reply(1, [P, P], first_slot=0), keys, sent_at=0.0)
    assert leases.grant(_reply(2, [P, A], first_slot=7), keys, sent_at=0.5) == []
    taken = leases.take(keys[:1], now=1.0)
    assert taken is not None and taken.slots == [7] and [x.req for x in taken.leases] == [2]
    assert leases.take(keys[1:], now=1.0) is not None  # still lease 1's
    # A lease all of whose keys were leased again holds nothing of use: given back.
    assert leases.grant(_reply(3, [P, P], first_slot=20), keys_for("m", 2), 0.0) == []
    assert leases.grant(_reply(4, [P, P], first_slot=30), keys_for("m", 2), 0.1) == [3]


def test_a_session_that_ends_forgets_its_leases() -> None:
    leases, keys = Leases(), keys_for("s", 3)
    leases.grant(_reply(1, [P] * 3), keys, sent_at=0.0)
    taken = leases.take(keys, now=0.1)
    assert taken is not None
    leases.grant(_reply(2, [P] * 3), keys_for("s2", 3), sent_at=0.0)
    leases.clear()
    assert leases.blocks == 0 and len(leases) == 0
    assert leases.take(keys_for("s2", 3), now=0.1) is None
    assert leases.finish(taken.leases) == []  # nothing to say: the server dropped them


# A real server, a hand-driven puller on the NIXL plane.

def nixl_hello(raw: RawPeer, engine: Engine, num_slots: int = 64) -> Welcome:
    """Hello on the NIXL plane (this side never READs: its agent is a name)."""
    plane = DataPlane("nixl", num_slots, engine.pool.slot_bytes, agent_metadata=b"raw")
    identity = dataclasses.replace(engine.tier.identity, capabilities=("nixl",))
    raw.send(encode(identity.hello(plane)))
    welcome, _ = raw.recv()
    assert isinstance(welcome, Welcome) and welcome.data_plane.kind == "nixl", welcome
    return welcome


@pytest.fixture
def nixl_server(engines: MakeEngine) -> Engine:
    engine = engines({"port": 0, **NIXL, "limits": {"max_pinned_share": 0.125},  # 8 of 64
                      "unbound_store_timeout_s": 2.0})
    engine.store(keys_for("a", 16))
    return engine


@needs_nixl
def test_a_lease_pins_what_the_lookup_found_and_says_where(nixl_server: Engine) -> None:
    raw = RawPeer(nixl_server.endpoint)
    try:
        nixl_hello(raw, nixl_server)
        keys = keys_for("a", 3) + keys_for("zzz", 1)
        raw.send(encode(Lookup(9, keys, 1.5)))
        reply, _ = raw.recv()
        assert isinstance(reply, LookupReply) and reply.req == 9
        assert reply.states == bytes([P, P, P, A]) and reply.lease_s == pytest.approx(1.5)
        for key, slot, sum_ in zip(keys, reply.source_slots, reply.checksums, strict=False):
            data = block_data(key, nixl_server.pool.block_bytes)
            assert bytes(nixl_server.pool.block(slot)) == data and checksum(data) == sum_
        assert pinned(nixl_server) == 3
        raw.send(encode(Landed(9)))
        wait_unpinned(nixl_server, timeout=1.0)  # before the lease's own end
        # Unsaid, a lease ends at its time (asked 60 s: at most the pin timeout).
        raw.send(encode(Lookup(10, keys[:2], 60.0)))
        reply, _ = raw.recv()
        assert isinstance(reply, LookupReply) and reply.lease_s == pytest.approx(2.0)
        assert pinned(nixl_server) == 2
        wait_unpinned(nixl_server, timeout=5.0)
        raw.send(encode(Lookup(11, keys[:2], 5.0)))
        raw.recv()
        raw.send(encode(Abort(11)))  # a lease no load wants
        wait_unpinned(nixl_server, timeout=2.0)
    finally:
        raw.close()


@needs_nixl
def test_no_lease_past_the_budget_for_repeated_keys_or_unasked(nixl_server: Engine) -> None:
    raw = RawPeer(nixl_server.endpoint)
    try:
        assert nixl_hello(raw, nixl_server).max_fetch == 8
        for req, (keys, lease_s) in enumerate([
                (keys_for("a", 9), 2.0),  # more than the peer may pin
                (keys_for("a", 2) * 2, 2.0),  # a key twice
                (keys_for("a", 2), 0.0)], start=1):  # no lease asked
            raw.send(encode(Lookup(req, keys, lease_s)))
            reply, _ = raw.recv()
            assert isinstance(reply, LookupReply) and reply.req == req
            assert reply.states.count(P) == len(keys) and not reply.lease_s
            assert reply.source_slots == [] and reply.checksums == []
            assert pinned(nixl_server) == 0
    finally:
        raw.close()


@needs_nixl
def test_a_zeromq_session_gets_no_lease(engines: MakeEngine) -> None:
    server = engines({"port": 0, "data_plane": "auto"})  # NIXL and frames
    server.store(keys_for("a", 2))
    raw = RawPeer(server.endpoint)
    try:
        raw.hello(server)  # frames: there is nothing for the puller to READ
        raw.send(encode(Lookup(1, keys_for("a", 2), 2.0)))
        reply, _ = raw.recv()
        assert reply == LookupReply(1, bytes([P, P]))
        assert pinned(server) == 0
    finally:
        raw.close()


# Two real engines.

def _pair(engines: MakeEngine, n: int = 16, **puller: object) -> tuple[Engine, Engine]:
    server = engines({"port": 0, **NIXL})
    server.store(keys_for("e", n))
    pull = engines({"peers": [server.endpoint], **NIXL, **puller})
    assert pull.wait_ready()
    return server, pull


def _counters(engine: Engine) -> dict[str, int]:
    assert engine.tier.server is not None
    return engine.tier.server.counters


def _probe(engine: Engine, keys: list[BlockKey], timeout: float = 20.0) -> None:
    """The tier's own lookups until every key is a hit (the probe's lookups lease
    them); nothing is loaded."""
    assert wait_for(lambda: [engine.tier.lookup(k) for k in keys].count(HIT) == len(keys),
                    timeout), "the probe never found the blocks"


@needs_nixl
def test_a_load_after_its_lookup_reads_under_the_lease_with_no_fetch(
        engines: MakeEngine) -> None:
    server, pull = _pair(engines)
    keys = keys_for("e", 16)
    assert pull.settle(keys) == [HIT] * 16
    pull.check_loaded(keys)  # the bytes the server stored
    link = next(iter(pull.tier.links.values()))
    assert _counters(server)["leases"] >= 1 and _counters(server)["fetches"] == 0
    assert link.leases.used >= 1
    assert wait_for(lambda: pinned(server) == 0, 1.0), "the lease outlived its load (2 s)"
    assert link.leases.blocks == 0


@needs_nixl
def test_without_leases_a_load_fetches(engines: MakeEngine) -> None:
    server, pull = _pair(engines, lease_s=0)
    keys = keys_for("e", 16)
    assert pull.settle(keys) == [HIT] * 16
    pull.check_loaded(keys)
    assert _counters(server)["leases"] == 0 and _counters(server)["fetches"] >= 1


@needs_nixl
def test_a_lease_lapsed_before_the_load_is_fetched_instead(engines: MakeEngine) -> None:
    server, pull = _pair(engines, lease_s=0.05)
    keys = keys_for("e", 16)
    _probe(pull, keys)
    link = next(iter(pull.tier.links.values()))
    assert wait_for(lambda: link.leases.blocks == 0, 5.0)  # lapsed: given back unused
    assert link.leases.unused >= 1
    assert pull.settle(keys) == [HIT] * 16  # the probe's yes still holds: a fetch
    pull.check_loaded(keys)
    assert _counters(server)["fetches"] >= 1
    assert wait_for(lambda: pinned(server) == 0, 5.0)


@needs_nixl
def test_a_block_changed_under_its_lease_is_a_miss_never_its_bytes(
        engines: MakeEngine) -> None:
    server, pull = _pair(engines, n=4)
    keys = keys_for("e", 4)
    _probe(pull, keys)
    link = next(iter(pull.tier.links.values()))
    assert link.leases.blocks == 4
    # The server's copy of keys[0] changes behind the lease (what a lease the server
    # ended and a slot reused would give the READ).
    slot = server.mgr.prepare_load(keys[:1])[0]
    server.pool.block(slot)[:] = os.urandom(server.pool.block_bytes)
    server.mgr.complete_load(keys[:1])
    answers = pull.settle(keys, timeout=3.0)
    assert answers[1:] == [HIT] * 3 and answers[0] is not HIT
    assert pull.tier.stats().errors.get("corrupt", 0) >= 1
    pull.check_loaded(keys[1:])


@needs_nixl
def test_a_fetch_takes_the_budget_back_from_leases_no_load_took(
        engines: MakeEngine) -> None:
    server = engines({"port": 0, **NIXL, "limits": {"max_pinned_share": 0.125}})  # 8
    server.store(keys_for("a", 8) + keys_for("b", 4))
    # Leases that outlive the test: only giving them back frees the budget.
    pull = engines({"peers": [server.endpoint], **NIXL, "lease_s": 60})
    assert pull.wait_ready()
    _probe(pull, keys_for("a", 8))  # leased: the whole budget
    link = next(iter(pull.tier.links.values()))
    assert link.leases.blocks == 8 and pinned(server) == 8
    b = keys_for("b", 4)
    assert pull.settle(b) == [HIT] * 4  # no lease (no room), then a fetch
    pull.check_loaded(b)
    assert link.leases.unused >= 1 and _counters(server)["over_budget"] == 0
    assert wait_for(lambda: pinned(server) == 0, 5.0)
    time.sleep(0.1)
    assert link.leases.blocks == 0
