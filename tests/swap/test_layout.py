"""Layouts, job planning and the method choice, without copying anything."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from kvtiers.contract.namespace import BlockGeometry
from kvtiers.swap import KVLayout, MethodPolicy
from kvtiers.swap.plan import check_blocks, make_runs, split_runs

from tests.swap.kv import KINDS, make_engine

LAYERS = 3


@pytest.mark.parametrize(
    ("kind", "runs", "run_fragments"),
    [
        ("cross", 1, 2 * LAYERS),  # a page is one run
        ("cross_lkp", 2 * LAYERS, 1),
        ("views_of_cross", 1, 2 * LAYERS),  # per-layer views of one buffer merge too
        ("page_first", LAYERS, 2),  # K and V of a layer are adjacent
        ("kv_first", 2 * LAYERS, 1),
        ("pairs", 2 * LAYERS, 1),
    ],
)
def test_runs_per_block_with_one_page_per_block(kind: str, runs: int, run_fragments: int) -> None:
    layout = make_engine(kind, layers=LAYERS).layout
    assert layout.runs_per_block == runs
    assert set(layout.templates.length.tolist()) == {run_fragments * layout.page_bytes}
    plan = make_runs(layout, np.array([[5], [2]]), np.array([0, 10 * layout.block_bytes]))
    assert len(plan) == 2 * runs and plan.nbytes == 2 * layout.rank_bytes


@pytest.mark.parametrize("kind", KINDS)
def test_several_pages_per_block_interleave_fragments(kind: str) -> None:
    layout = make_engine(kind, layers=LAYERS, pages_per_block=3).layout
    assert layout.tokens_per_block == 3 * layout.page_tokens
    assert layout.runs_per_block == 2 * LAYERS * 3
    # Canonical offsets: stream f, page j of the block at (f * 3 + j) * page_bytes.
    t = layout.templates
    assert t.canon.tolist() == [f * 3 * layout.page_bytes for f in range(2 * LAYERS)]


def test_adjacent_pages_of_a_block_coalesce() -> None:
    layout = make_engine("kv_first", layers=LAYERS, pages_per_block=2).layout
    runs = make_runs(layout, np.array([[4, 5]]), np.array([0]))
    assert len(runs) == 2 * LAYERS  # pages 4 and 5 follow each other in every stream
    assert set(runs.length.tolist()) == {2 * layout.page_bytes}
    runs = make_runs(layout, np.array([[5, 4]]), np.array([0]))
    assert len(runs) == 4 * LAYERS
    uncoalesced = make_runs(layout, np.array([[4, 5]]), np.array([0]), coalesce_runs=False)
    assert len(uncoalesced) == 4 * LAYERS


def test_split_runs_cuts_evenly() -> None:
    layout = make_engine("cross", layers=LAYERS).layout
    runs = make_runs(layout, np.array([[1], [2]]), np.array([0, 8192]))
    assert runs.length.tolist() == [768, 768]
    pieces = split_runs(runs, 200)
    assert pieces.length.tolist() == [200, 200, 200, 168] * 2
    assert pieces.engine[1] - pieces.engine[0] == 200
    assert pieces.buffer[4] == 8192


def test_geometry_and_tensor_parallel_sizes() -> None:
    eng = make_engine("page_first", layers=4, heads=2, head_size=8, tokens=4, tp_size=2)
    layout = eng.layout
    g = layout.geometry()
    assert g == BlockGeometry(
        layers=4, kv_heads=2, head_size=8, dtype="bfloat16", tokens_per_block=4, tp_size=2
    )
    assert g.block_bytes == layout.block_bytes == 2 * layout.rank_bytes
    assert g.rank_bytes == layout.rank_bytes


def test_layout_errors_name_the_problem() -> None:
    t = torch.empty(2, 4, 3, 2, 8)
    with pytest.raises(ValueError, match="last three axes must be T H D"):
        KVLayout([t], "KPHTD")
    with pytest.raises(ValueError, match="K axis must have size 2"):
        KVLayout.per_layer([torch.empty(3, 4, 3, 2, 8)])
    with pytest.raises(ValueError, match="all must match"):
        KVLayout.per_layer([t, torch.empty(2, 5, 3, 2, 8)])
    with pytest.raises(ValueError, match="contiguous"):
        KVLayout.per_layer([torch.empty(2, 4, 2, 3, 8).transpose(2, 3)])
    with pytest.raises(ValueError, match="exactly one tensor"):
        KVLayout([t, t], "LKPTHD")
    with pytest.raises(ValueError, match="drop 'K'"):
        KVLayout([(t[0], t[1])], "KPTHD")
    with pytest.raises(ValueError, match="pages_per_block"):
        KVLayout.per_layer([t], pages_per_block=0)


def test_check_blocks_rejects_per_block() -> None:
    layout = make_engine("kv_first", pages=8).layout
    c = check_blocks(layout, 4, [0, 9, 1, 2], [3, 0, 3, 1], "store")
    assert c.valid.tolist() == [False, False, False, True]  # 9: no such page; 3 twice
    assert c.slots.tolist() == [1] and c.pages.tolist() == [[2]]
    c = check_blocks(layout, 4, [0, 1], [3, 3], "load")  # one slot into two pages: fine
    assert c.valid.all()
    with pytest.raises(ValueError, match="gpu pages"):
        check_blocks(layout, 4, [0, 1, 2], [3, 3], "load")


def test_auto_chooses_dma_for_long_runs_and_the_small_method_for_fragments() -> None:
    p = MethodPolicy()
    assert p.choose(None, runs=100, nbytes=100 * 2 * 2**20) == "dma"
    assert p.choose(None, runs=6400, nbytes=6400 * 32 * 2**10) == "staged"
    assert p.choose(None, runs=4, nbytes=4 * 1024) == "dma"  # a handful of copies
    assert p.choose("kernel", runs=4, nbytes=4 * 1024) == "kernel"
    p.restrict(("dma", "kernel"))  # no staging buffer
    assert p.choose(None, runs=6400, nbytes=6400 * 32 * 2**10) == "kernel"
    p.restrict(("dma",))
    assert p.choose("staged", runs=6400, nbytes=1) == "dma"
    with pytest.raises(ValueError):
        MethodPolicy("fastest")


def test_import_kvtiers_does_not_import_torch() -> None:
    code = "import sys, kvtiers; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
