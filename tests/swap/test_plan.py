"""Cutting copy runs at the pool's CUDA registration edges."""

from __future__ import annotations

import numpy as np
from kvtiers.swap.plan import Runs, split_at_boundaries


def test_runs_are_cut_at_every_edge_and_cover_the_same_bytes() -> None:
    rng = np.random.default_rng(3)
    base, step = 4096, 3 * 8192
    n = 200
    buffer = base + rng.integers(0, 40, n) * 4096
    length = rng.integers(1, 12, n) * 4096
    engine = rng.integers(0, 1 << 30, n) * 2
    runs = Runs(rng.integers(0, 3, n), engine, buffer, length)
    cut = split_at_boundaries(runs, base, step)
    # No piece crosses an edge.
    assert (((cut.buffer - base) // step) == ((cut.buffer + cut.length - 1 - base) // step)).all()
    assert (cut.length > 0).all()
    # The pieces, in order, are exactly the runs: same bytes on both sides.
    i = 0
    for r in range(n):
        pos, end = int(buffer[r]), int(buffer[r] + length[r])
        while pos < end:
            assert (cut.region[i], cut.buffer[i]) == (runs.region[r], pos)
            assert cut.engine[i] == engine[r] + (pos - buffer[r])
            pos += int(cut.length[i])
            i += 1
        assert pos == end
    assert i == len(cut)


def test_runs_inside_one_registration_are_left_alone() -> None:
    runs = Runs(np.zeros(2, np.int64), np.array([0, 100]), np.array([0, 8192]),
                np.array([4096, 4096]))
    assert split_at_boundaries(runs, 0, 1 << 20) is runs
