"""The CPU swapper's two copy paths: the optional native `kvtiers.swap._memcpy`
(`copy_batch`, tested directly and against the numpy path) and the numpy fallback,
which the end-to-end tests of test_swapper.py run through again below with the
native helper switched off."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kvtiers.swap.cpu_backend as cpu_backend
import numpy as np
import pytest
import torch
from kvtiers.swap.plan import Runs

from tests.swap.test_swapper import (  # re-run here on the numpy fallback
    test_concurrent_store_and_load_jobs,
    test_consecutive_pages_into_consecutive_slots,
    test_every_page_and_slot_in_random_order,
    test_failures_are_results_and_valid_blocks_still_move,
    test_fp32_and_odd_sizes,
    test_groups_with_different_page_sizes,
    test_jobs_larger_than_the_copy_buffers,
    test_round_trip_every_layout,
    test_tp_ranks_write_disjoint_parts_of_one_slot,
)

try:
    from kvtiers.swap import _memcpy

    NATIVE = True
except ImportError:  # the tests that use it are skipped
    NATIVE = False

native = pytest.mark.skipif(not NATIVE, reason="kvtiers.swap._memcpy was not built")

__all__ = [
    "test_concurrent_store_and_load_jobs",
    "test_consecutive_pages_into_consecutive_slots",
    "test_every_page_and_slot_in_random_order",
    "test_failures_are_results_and_valid_blocks_still_move",
    "test_fp32_and_odd_sizes",
    "test_groups_with_different_page_sizes",
    "test_jobs_larger_than_the_copy_buffers",
    "test_round_trip_every_layout",
    "test_tp_ranks_write_disjoint_parts_of_one_slot",
]


@pytest.fixture
def backend() -> tuple[str, str | None]:
    return ("cpu", None)


@pytest.fixture(autouse=True)
def numpy_fallback(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The imported swapper tests run with the native helper switched off, and check
    that the numpy path did the copying."""
    if request.node.function.__module__ == __name__:
        yield
        return
    calls = []
    copy_rows = cpu_backend._copy_rows

    def counted(*a: Any) -> None:
        calls.append(1)
        copy_rows(*a)

    monkeypatch.setattr(cpu_backend, "_memcpy", None)
    monkeypatch.setattr(cpu_backend, "_copy_rows", counted)
    yield
    assert calls, "the numpy path never ran"


def _layout(
    rng: np.random.Generator, n: int, size: int, max_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """`n` disjoint ranges of random lengths in random order within `size` bytes."""
    lengths = rng.integers(0, max_len, n)
    gaps = rng.integers(0, 64, n)
    starts = np.cumsum(gaps + lengths) - lengths
    assert starts[-1] + lengths[-1] <= size
    perm = rng.permutation(n)
    return starts[perm].astype(np.int64), lengths[perm].astype(np.int64)


@native
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_copy_batch_random_layout(threads: int) -> None:
    rng = np.random.default_rng(threads)
    n, size = 300, 8 << 20
    src = rng.integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, np.uint8)
    s_off, lengths = _layout(rng, n, size, 20_000)
    # Destinations: disjoint ranges of exactly `lengths`, laid out in another order.
    order = rng.permutation(n)
    d_off = np.empty(n, np.int64)
    d_off[order] = np.cumsum(lengths[order] + 8) - lengths[order]
    expected = np.zeros(size, np.uint8)
    for i in range(n):
        expected[d_off[i] : d_off[i] + lengths[i]] = src[s_off[i] : s_off[i] + lengths[i]]
    _memcpy.copy_batch(
        d_off + dst.ctypes.data, (s_off + src.ctypes.data).astype(np.uint64), lengths, threads
    )
    assert np.array_equal(dst, expected)


@native
def test_copy_batch_edges() -> None:
    a = np.arange(64, dtype=np.uint8)
    b = np.zeros(64, np.uint8)
    addr = np.array([b.ctypes.data], np.int64), np.array([a.ctypes.data], np.int64)
    _memcpy.copy_batch(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), 2)
    _memcpy.copy_batch(*addr, np.array([0], np.int64), 4)  # fewer bytes than threads
    assert not b.any()
    _memcpy.copy_batch(*addr, np.array([64], np.int64), 64)
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="lengths differ"):
        _memcpy.copy_batch(*addr, np.array([1, 2], np.int64), 1)
    with pytest.raises(ValueError, match="lengths differ"):
        _memcpy.copy_batch(addr[0], np.empty(0, np.int64), np.array([1], np.int64), 2)
    with pytest.raises(TypeError, match="8-byte integers"):
        _memcpy.copy_batch(*addr, np.array([1], np.int32), 1)
    with pytest.raises(TypeError, match="8-byte integers"):
        _memcpy.copy_batch(*addr, np.array([1.0]), 1)
    with pytest.raises(ValueError, match="threads"):
        _memcpy.copy_batch(*addr, np.array([1], np.int64), 0)
    with pytest.raises(ValueError):  # not contiguous
        _memcpy.copy_batch(np.zeros(4, np.int64)[::2], addr[1], np.zeros(2, np.int64), 1)


def _job(rng: np.random.Generator, regions_bytes: list[int], row: int, n: int) -> Runs:
    """Runs of `n` random rows from random regions into random buffer rows."""
    rows = [(r, k) for r, size in enumerate(regions_bytes) for k in range(size // row)]
    region, k = np.array(rows, np.int64)[rng.permutation(len(rows))[:n]].T
    engine = k * row
    buffer = rng.permutation(n).astype(np.int64) * row
    return Runs(region.astype(np.int64), engine, buffer, np.full(n, row, np.int64))


@native
@pytest.mark.parametrize("to_buffer", [True, False])
@pytest.mark.parametrize("row", [32 * 1024, 256 * 1024 + 8])
def test_native_and_numpy_paths_agree(
    monkeypatch: pytest.MonkeyPatch, to_buffer: bool, row: int
) -> None:
    """A job of several MiB (the native path splits it over two threads) gives the
    same bytes as the numpy path."""
    rng = np.random.default_rng(row)
    g = torch.Generator().manual_seed(row)
    regions = [torch.randint(0, 256, (n * row,), dtype=torch.uint8, generator=g) for n in (9, 13)]
    n = 16
    runs = _job(rng, [r.numel() for r in regions], row, n)
    buffer = torch.randint(0, 256, (n * row + 100,), dtype=torch.uint8, generator=g)
    temp = np.empty(1 << 20, np.uint8)
    results = []
    with ThreadPoolExecutor(1) as helpers:
        for native_on in (True, False):
            rs, buf = [r.clone() for r in regions], buffer.clone()
            if not native_on:
                monkeypatch.setattr(cpu_backend, "_memcpy", None)
            cpu_backend.copy_runs(rs, buf, runs, to_buffer, temp, helpers)
            results.append((rs, buf))
    (rs_n, buf_n), (rs_p, buf_p) = results
    assert torch.equal(buf_n, buf_p) and all(map(torch.equal, rs_n, rs_p))
    changed = (
        not torch.equal(buf_n, buffer)
        if to_buffer
        else any(not torch.equal(a, b) for a, b in zip(rs_n, regions, strict=True))
    )
    assert changed


@native
@pytest.mark.parametrize(
    "bad",
    [
        {"engine": 9 * 64 - 32},  # runs past the end of region 0
        {"buffer": 1000},  # past the end of the buffer
        {"region": 2},  # no such region
        {"region": -1},
        {"length": -8},
    ],
)
def test_native_path_checks_bounds(bad: dict[str, int]) -> None:
    regions = [torch.zeros(9 * 64, dtype=torch.uint8), torch.zeros(64, dtype=torch.uint8)]
    buffer = torch.ones(1024, dtype=torch.uint8)
    fields = {"region": 0, "engine": 0, "buffer": 0, "length": 64, **bad}
    runs = Runs(
        *(np.array([0, fields[k]], np.int64) for k in ("region", "engine", "buffer", "length"))
    )
    runs.length[0] = 64  # a good run first: nothing at all may be copied
    with pytest.raises(RuntimeError, match="outside"):
        cpu_backend.copy_runs(regions, buffer, runs, False, np.empty(1024, np.uint8))
    assert not regions[0].any() and not regions[1].any()
