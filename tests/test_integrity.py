"""`kvtiers.sdk.integrity`'s batch forms, `checksum_slots` and `land_slots`: the C
helper (when built) and the Python path give the values `checksum` gives, block by
block, and refuse bad input before touching anything."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvtiers.contract.pool_view import PoolView
from kvtiers.sdk import integrity
from kvtiers.sdk.integrity import checksum, checksum_slots, land_slots

PATHS = ["python", *(["native"] if integrity._native is not None else [])]


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "python":
        monkeypatch.setattr(integrity, "_native", None)
    yield request.param


def filled(slots: int, block: int) -> PoolView:
    pool = PoolView.anonymous(slots, block)
    for s in range(slots):
        pool.block(s)[:] = os.urandom(block)
    return pool


def test_the_helper_is_built_here() -> None:
    """The C helper builds wherever kvtiers-core's others do (xxhash exports its
    API); a silent fallback would hide a broken build."""
    if os.environ.get("KVTIERS_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("KVTIERS_PURE_PYTHON asks for the Python paths")
    assert integrity._native is not None


@pytest.mark.parametrize("block", [1, 4095, 32768, 2 << 20])
def test_sums_of_slots_are_each_blocks_checksum(path: str, block: int) -> None:
    pool = filled(6, block)
    slots = [5, 0, 3, 3, 1]
    assert checksum_slots(pool, slots) == [checksum(pool.block(s)) for s in slots]
    assert checksum_slots(pool, []) == []


def test_only_block_bytes_are_summed_not_the_slot_padding(path: str) -> None:
    pool = filled(3, 5000)  # slots of 8192 bytes
    pool.buffer[5000:8192] = os.urandom(3192)
    assert checksum_slots(pool, [0]) == [checksum(bytes(pool.block(0)))]


@pytest.mark.parametrize("bad", [-1, 4, 1 << 40])
def test_a_slot_outside_the_pool_is_refused(path: str, bad: int) -> None:
    pool = filled(4, 4096)
    with pytest.raises((IndexError, OverflowError)):
        checksum_slots(pool, [0, bad])


def test_landing_copies_each_buffer_into_its_slot_and_sums_it(path: str) -> None:
    pool = filled(8, 32768)
    data = [os.urandom(32768) for _ in range(4)]
    frames = [data[0], bytearray(data[1]), memoryview(data[2]), memoryview(data[3])]
    slots = [7, 2, 0, 5]
    sums = land_slots(pool, slots, frames)
    assert sums == [checksum(d) for d in data]
    for slot, d in zip(slots, data, strict=True):
        assert bytes(pool.block(slot)) == d


def test_landing_refuses_a_wrong_size_or_count_and_copies_nothing(path: str) -> None:
    pool = filled(4, 4096)
    before = bytes(pool.buffer)
    with pytest.raises(ValueError):
        land_slots(pool, [0, 1], [os.urandom(4096), os.urandom(4095)])
    with pytest.raises(ValueError):
        land_slots(pool, [0, 1], [os.urandom(4096)])
    assert bytes(pool.buffer) == before
    with pytest.raises(IndexError):
        land_slots(pool, [0, 4], [os.urandom(4096), os.urandom(4096)])
    if path == "native":  # checked before any copy (the Python path copies slot 0)
        assert bytes(pool.buffer) == before


def test_a_pool_that_overrides_block_is_reached_through_it() -> None:
    """A pool subclass's `block` (a test's gate, a failing slot) sees every slot
    the batch forms touch, with the C helper built or not."""
    seen: list[int] = []

    class Watched(PoolView):
        def block(self, slot: int) -> memoryview:
            seen.append(slot)
            return super().block(slot)

    pool = Watched(bytearray(4 * 4096), 4096)
    data = [os.urandom(4096) for _ in range(2)]
    assert land_slots(pool, [3, 1], data) == [checksum(d) for d in data]
    assert checksum_slots(pool, [1, 3]) == [checksum(data[1]), checksum(data[0])]
    assert seen == [3, 1, 1, 3]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9000), st.lists(st.integers(0, 7), max_size=12), st.integers(0, 2**32))
def test_both_paths_agree(block: int, slots: list[int], seed: int) -> None:
    rng = random.Random(seed)
    pool = PoolView.anonymous(8, block)
    pool.buffer[:] = rng.randbytes(len(pool.buffer))
    want = [checksum(pool.block(s)) for s in slots]
    assert checksum_slots(pool, slots) == want
    native, integrity._native = integrity._native, None
    try:
        assert checksum_slots(pool, slots) == want
    finally:
        integrity._native = native
