"""`NixlReads` without NIXL: a fake plane that copies between two real pools stands
for the transfer (each call one READ on a stream), so that how a fetch's READ is cut
into pieces, spread over the streams, verified, failed and abandoned is checked with
real bytes and real checksums on every machine."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import kvtiers_p2p.pull.nixl_reads as nixl_reads
import pytest
from kvtiers.contract.jobs import FailureReason
from kvtiers.contract.pool_view import PoolView
from kvtiers.sdk.integrity import checksum
from kvtiers_p2p.pull.nixl_reads import NixlReads, piece_blocks
from kvtiers_p2p.wire.protocol import DataPlane, State, TransferDone

BB = 4096
PIECE = 4  # blocks per piece in these tests (PIECE_BYTES patched below)


class FakePlane:
    """`streams` streams; `read_slots` copies theirs[i] of `remote` into ours[i]
    of `pool` and records (stream, theirs); `gate`, when set, holds every READ
    until it is opened; `fail` makes READs that include one of its slots end
    "ERR" without copying."""

    def __init__(self, remote: PoolView, pool: PoolView, streams: int):
        self.remote, self.pool, self.streams = remote, pool, streams
        self.calls: list[tuple[int, list[int]]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.fail: set[int] = set()
        self._lock = threading.Lock()

    def read_slots(self, name: str, theirs: Sequence[int], ours: Sequence[int],
                   timeout: float, stream: int = 0) -> str:
        with self._lock:
            self.calls.append((stream, list(theirs)))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        if self.fail & set(theirs):
            return "ERR"
        for t, o in zip(theirs, ours, strict=True):
            self.pool.block(o)[:] = self.remote.block(t)
        return "DONE"


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nixl_reads, "PIECE_BYTES", PIECE * BB)


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=4)
    yield pool
    pool.shutdown(wait=True)


def _pools(n: int) -> tuple[PoolView, PoolView]:
    remote, local = PoolView.anonymous(n, BB), PoolView.anonymous(n, BB)
    for s in range(n):
        remote.block(s)[:] = os.urandom(BB)
        local.block(s)[:] = os.urandom(BB)
    return remote, local


def _reads(plane: FakePlane, executor: ThreadPoolExecutor) -> NixlReads:
    return NixlReads(cast(Any, plane), plane.pool, executor, endpoint="tcp://fake:1",
                     logger=logging.getLogger("test"))


def _done(remote: PoolView, theirs: list[int], sums: list[int] | None = None) -> TransferDone:
    return TransferDone(1, bytes([State.PRESENT]) * len(theirs),
                        sums if sums is not None else
                        [checksum(remote.block(t)) for t in theirs], theirs)


def _far(remote: PoolView) -> tuple[str, DataPlane]:
    return "far", DataPlane("nixl", remote.num_slots, remote.slot_bytes)


def test_a_piece_is_at_least_one_block() -> None:
    assert piece_blocks(BB) == PIECE
    assert piece_blocks(1 << 40) == 1


@pytest.mark.parametrize("streams", [1, 2])
def test_a_fetch_moves_in_pieces_on_every_stream_and_every_block_is_verified(
        executor: ThreadPoolExecutor, streams: int) -> None:
    n = 10
    remote, local = _pools(n)
    plane = FakePlane(remote, local, streams)
    reads = _reads(plane, executor)
    theirs = [(7 * i + 3) % n for i in range(n)]  # scattered, every slot once
    ours = list(range(n))
    plane.gate = threading.Event()  # both streams take a piece before any ends

    async def go() -> list[Any]:
        landing = reads.start(_far(remote), _done(remote, theirs), ours, 10.0)
        assert not isinstance(landing, list)
        await asyncio.to_thread(plane.entered.wait, 10)
        if streams > 1:
            for _ in range(200):  # the second stream's pump reaches its READ
                if len(plane.calls) >= 2:
                    break
                await asyncio.sleep(0.005)
        assert plane.gate is not None
        plane.gate.set()
        return await reads.finish(landing)

    out = asyncio.run(go())
    assert out == [None] * n
    assert sorted(s for _, call in plane.calls for s in call) == sorted(theirs)
    assert sorted(len(call) for _, call in plane.calls) == [2, 4, 4]  # 10 in pieces of 4
    assert {stream for stream, _ in plane.calls} == set(range(streams))
    for t, o in zip(theirs, ours, strict=True):
        assert local.block(o) == remote.block(t)


def test_a_bad_checksum_fails_only_its_block_and_a_failed_read_only_its_piece(
        executor: ThreadPoolExecutor) -> None:
    n = 10
    remote, local = _pools(n)
    plane = FakePlane(remote, local, 2)
    reads = _reads(plane, executor)
    theirs = list(range(n))
    sums = [checksum(remote.block(t)) for t in theirs]
    sums[1] ^= 1  # the server's sum does not match what lands: corrupt
    plane.fail = {9}  # the last piece (blocks 8, 9) fails its READ

    async def go() -> list[Any]:
        return await reads.finish(reads.start(_far(remote), _done(remote, theirs, sums),
                                              list(range(n)), 10.0))

    out = asyncio.run(go())
    assert out[1] is FailureReason.CORRUPT
    assert out[8] is FailureReason.IO and out[9] is FailureReason.IO
    assert [i for i, o in enumerate(out) if o is None] == [0, 2, 3, 4, 5, 6, 7]
    for i in (0, 2, 3, 4, 5, 6, 7):
        assert local.block(i) == remote.block(i)


def test_an_abandoned_fetch_returns_only_once_no_thread_touches_its_slots(
        executor: ThreadPoolExecutor) -> None:
    """One stream: the first piece is held in its READ; abandoning takes the
    others out of the queue, and returns only after the held one let go; the
    pieces taken out are never read, their slots keep what they had."""
    n = 12
    remote, local = _pools(n)
    before = [bytes(local.block(s)) for s in range(n)]
    plane = FakePlane(remote, local, 1)
    plane.gate = threading.Event()
    reads = _reads(plane, executor)
    returned = threading.Event()

    async def go() -> None:
        landing = reads.start(_far(remote), _done(remote, list(range(n))), list(range(n)),
                              10.0)
        assert not isinstance(landing, list)
        await asyncio.to_thread(plane.entered.wait, 10)
        task = asyncio.ensure_future(reads.abandon(landing))
        await asyncio.sleep(0.05)
        assert not task.done(), "abandon returned while a READ held the slots"
        assert plane.gate is not None
        plane.gate.set()
        await asyncio.wait_for(task, 10)
        returned.set()

    asyncio.run(go())
    assert returned.is_set()
    assert [call for _, call in plane.calls] == [[0, 1, 2, 3]]  # only the held piece
    for s in range(4):
        assert local.block(s) == remote.block(s)
    for s in range(4, n):
        assert local.block(s) == before[s]
    # The stream is free again: a next fetch moves.
    plane.gate = None

    async def again() -> list[Any]:
        return await reads.finish(reads.start(_far(remote), _done(remote, [5]), [5], 10.0))

    assert asyncio.run(again()) == [None]
    assert local.block(5) == remote.block(5)


def test_an_abandoned_fetch_none_of_which_began_returns_at_once(
        executor: ThreadPoolExecutor) -> None:
    n = 8
    remote, local = _pools(n)
    plane = FakePlane(remote, local, 1)
    plane.gate = threading.Event()
    reads = _reads(plane, executor)

    async def go() -> None:
        first = reads.start(_far(remote), _done(remote, [0]), [0], 10.0)  # holds the stream
        await asyncio.to_thread(plane.entered.wait, 10)
        second = reads.start(_far(remote), _done(remote, list(range(1, n))),
                             list(range(1, n)), 10.0)
        await asyncio.wait_for(reads.abandon(second), 5)  # queued only: nothing to wait for
        assert plane.gate is not None
        plane.gate.set()
        assert await reads.finish(first) == [None]

    asyncio.run(go())
    assert [call for _, call in plane.calls] == [[0]]
