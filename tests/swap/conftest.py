from __future__ import annotations

import time
from collections.abc import Iterable

import pytest
import torch
from kvtiers.swap import DeviceSwapper, SwapResult

CUDA = torch.cuda.is_available()

cuda_only = [pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]


def collect(
    swapper: DeviceSwapper, job_ids: Iterable[int], timeout: float = 30.0
) -> dict[int, SwapResult]:
    """Poll `get_finished` until every job in `job_ids` reported (results by id)."""
    want = set(job_ids)
    got: dict[int, SwapResult] = {}
    deadline = time.monotonic() + timeout
    while want - got.keys():
        for r in swapper.get_finished():
            assert r.job_id not in got, f"job {r.job_id} reported twice"
            got[r.job_id] = r
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs never finished: {sorted(want - got.keys())}")
        time.sleep(0.001)
    return got


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(1234)
    return g
