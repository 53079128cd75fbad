"""`GroupPlanner` (the per-group templates the CUDA backend plans with) gives the same
runs as `plan.make_runs`, and the same kernel pieces as `split_runs` of the
uncoalesced runs, for every layout, pages per block, TP rank and page/slot order
(consecutive ones too, where runs coalesce). Also the fast path of `check_blocks`
against its per-block path."""

from __future__ import annotations

import numpy as np
import pytest
from kvtiers.swap.plan import LOAD, PIECE_BYTES, STORE, check_blocks, make_runs, split_runs
from kvtiers.swap.planner import GroupPlanner, coalesce_arrays

from tests.swap.kv import KINDS, make_engine


def _absolute(planner: GroupPlanner, runs_region: np.ndarray, engine: np.ndarray) -> np.ndarray:
    out: np.ndarray = planner.layout.region_addresses[runs_region] + engine
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pages_per_block", [1, 2, 3])
@pytest.mark.parametrize("order", ["random", "consecutive"])
def test_runs_and_pieces_equal_make_runs(kind: str, pages_per_block: int, order: str) -> None:
    rng = np.random.default_rng(hash((kind, pages_per_block, order)) % 2**32)
    eng = make_engine(kind, pages=24, pages_per_block=pages_per_block, tp_size=2)
    layout = eng.layout
    planner = GroupPlanner(layout, layout.region_addresses, piece_bytes=96)
    blocks = 24 // pages_per_block
    for trial in range(4):
        b = int(rng.integers(1, blocks + 1))
        if order == "random":
            pages = rng.permutation(24)[: b * pages_per_block].reshape(b, pages_per_block)
            slots = rng.permutation(40)[:b]
        else:
            first = int(rng.integers(0, 24 - b * pages_per_block + 1))
            pages = np.arange(first, first + b * pages_per_block).reshape(b, pages_per_block)
            slots = np.arange(3, 3 + b)
        slot_bytes = layout.block_bytes + 64 * trial  # padded slots break coalescing
        offsets = slots * slot_bytes + layout.rank_bytes  # rank 1
        want = make_runs(layout, pages, offsets)
        engine, buffer, length = planner.runs(pages, offsets)
        np.testing.assert_array_equal(engine, _absolute(planner, want.region, want.engine))
        np.testing.assert_array_equal(buffer, want.buffer)
        np.testing.assert_array_equal(length, want.length)

        pieces = split_runs(make_runs(layout, pages, offsets, coalesce_runs=False), 96)
        p_engine, p_buffer, words = planner.piece_runs(pages, offsets)
        np.testing.assert_array_equal(p_engine, _absolute(planner, pieces.region, pieces.engine))
        np.testing.assert_array_equal(p_buffer, pieces.buffer)
        np.testing.assert_array_equal(words * 8, pieces.length)


def test_consecutive_cross_layer_blocks_become_one_run() -> None:
    eng = make_engine("cross", pages=16)
    layout = eng.layout
    planner = GroupPlanner(layout, layout.region_addresses)
    offsets = np.arange(8) * layout.block_bytes
    engine, buffer, length = planner.runs(np.arange(4, 12).reshape(8, 1), offsets)
    assert length.tolist() == [8 * layout.block_bytes]


def test_default_pieces_are_the_kernel_piece_size() -> None:
    eng = make_engine("cross", layers=32, tokens=16, heads=8, head_size=128, pages=2)
    planner = GroupPlanner(eng.layout, eng.layout.region_addresses)
    assert int(planner.pieces.length.max()) == PIECE_BYTES
    assert int(planner.pieces.length.sum()) == eng.layout.rank_bytes


def test_runs_of_different_regions_never_merge() -> None:
    # Two runs adjacent in memory but in different regions stay apart.
    engine = np.array([0, 100, 200])
    buffer = np.array([0, 100, 200])
    length = np.array([100, 100, 100])
    e, b, n = coalesce_arrays(engine, buffer, length, np.array([0, 1, 1]))
    assert e.tolist() == [0, 100] and b.tolist() == [0, 100] and n.tolist() == [100, 200]
    e, b, n = coalesce_arrays(engine, buffer, length)
    assert e.tolist() == [0] and n.tolist() == [300]


@pytest.mark.parametrize("direction", [STORE, LOAD])
def test_check_fast_path_agrees_with_the_per_block_check(direction: str) -> None:
    rng = np.random.default_rng(7)
    eng = make_engine("kv_first", pages=16, pages_per_block=2)
    layout = eng.layout
    seen_invalid = seen_valid = 0
    for _ in range(300):
        b = int(rng.integers(1, 8))
        pages = rng.integers(-1, 17, (b, 2))
        slots = rng.integers(-1, 13, b)
        got = check_blocks(layout, 12, pages, slots, direction)
        # The reference: every condition per block, written out.
        flat = pages.reshape(-1).tolist()
        want = []
        for i in range(b):
            ok = all(0 <= p < 16 for p in pages[i]) and 0 <= slots[i] < 12
            if direction == STORE:
                ok = ok and list(slots).count(slots[i]) == 1
            else:
                ok = ok and all(flat.count(p) == 1 for p in pages[i])
            want.append(ok)
        assert got.valid.tolist() == want
        assert (got.problem == "") == all(want)
        np.testing.assert_array_equal(got.slots, slots[np.array(want, bool)])
        np.testing.assert_array_equal(got.pages, pages[np.array(want, bool)])
        seen_invalid += not all(want)
        seen_valid += all(want)
    assert seen_invalid > 50 and seen_valid > 20
