"""`KvtiersSwapWorker` with two workers (TP=2) on CPU: each rank's worker writes its
part of vLLM's shared CPU rows, byte for byte where vLLM's layout puts it (rank r at
`r * cpu_page_size` of each row, its tensors side by side), and loads it back into
its own GPU pages. vLLM's reference is the harness's memcpy worker over the views
vLLM's region carves for each rank (`create_next_worker_view`)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import torch
from kvtiers_vllm.worker import KvtiersSwapWorker
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

from tests.vllm import harness as h
from tests.vllm.test_spec import REGION_LOGGER, _canonical, kept_mapped
from tests.vllm.vllm_compat import device_side

WORLD, CHUNKS, BLOCKS = 2, 16, 32
PART = h.PAGE * h.LAYERS  # one rank's part of a row: every layer's page (4 KiB)


def _finished(worker: Any, n: int) -> list[Any]:
    done: list[Any] = []
    for _ in range(2000):
        done += worker.get_finished()
        if len(done) >= n:
            return done
        time.sleep(0.001)
    raise AssertionError(f"{len(done)} of {n} jobs finished")


def _regions(engine_id: str) -> list[SharedOffloadRegion]:
    return [
        SharedOffloadRegion(engine_id, CHUNKS, rank, WORLD * PART, PART) for rank in range(WORLD)
    ]


def test_two_ranks_write_and_read_their_parts_of_vllms_rows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gen = torch.Generator().manual_seed(60)
    gpus = [
        [torch.randint(-128, 128, (BLOCKS, h.PAGE), dtype=torch.int8, generator=gen)
         for _ in range(h.LAYERS)]
        for _ in range(WORLD)
    ]  # fmt: skip
    caches = [_canonical(gpu, [list(range(h.LAYERS))]) for gpu in gpus]
    ids = [h.new_engine_id(), h.new_engine_id()]
    theirs_regions, ours_regions = _regions(ids[0]), _regions(ids[1])
    workers: list[KvtiersSwapWorker] = []
    try:
        references = []
        for rank in range(WORLD):
            views = [theirs_regions[rank].create_next_worker_view(h.PAGE) for _ in range(h.LAYERS)]
            references.append(h.MemcpyWorker(caches[rank], 1, views))
            workers.append(
                KvtiersSwapWorker(caches[rank], ours_regions[rank], 1, rank=rank, world_size=WORLD)
            )
        src = GPULoadStoreSpec([3, 7, 9, 1], group_sizes=[4], block_indices=[0])
        dst = CPULoadStoreSpec([5, 0, 11, 2])
        for rank in range(WORLD):
            device = device_side(src, caches[rank])  # as vLLM's connector passes it
            assert references[rank].submit_store(1, device, dst)
            assert workers[rank].submit_store(1, device, dst)
        for worker in workers:
            [result] = _finished(worker, 1)
            assert result.success and result.transfer_size == 4 * PART  # its part only
        mine = ours_regions[0].base_tensor.numpy()
        want = theirs_regions[0].base_tensor.numpy()
        assert np.count_nonzero(want) > 0.9 * 4 * WORLD * PART
        assert np.array_equal(mine, want)
        # Each rank's part holds that rank's pages: rank 1's bytes at PART in the row.
        row = mine.view(np.uint8).reshape(CHUNKS, WORLD * PART)
        for rank in range(WORLD):
            for layer in range(h.LAYERS):
                start = rank * PART + layer * h.PAGE
                assert np.array_equal(
                    row[5, start : start + h.PAGE], gpus[rank][layer][3].numpy().view(np.uint8)
                )
        # And back into other pages of each rank's own GPU cache.
        back = GPULoadStoreSpec([20, 21, 22, 23], group_sizes=[4], block_indices=[0])
        saved = [[t.clone() for t in gpu] for gpu in gpus]
        for gpu in gpus:
            for t in gpu:
                t[20:24] = 0
        for rank, worker in enumerate(workers):
            assert worker.submit_load(2, dst, device_side(back, caches[rank]))
            _finished(worker, 1)
        for rank in range(WORLD):
            for layer in range(h.LAYERS):
                got = gpus[rank][layer][20:24]
                assert torch.equal(got, saved[rank][layer][[3, 7, 9, 1]])
        del mine, want, row, views, references
    finally:
        with caplog.at_level(logging.WARNING, logger=REGION_LOGGER):
            for worker in workers:
                worker.shutdown()
            for region in theirs_regions + ours_regions[len(workers) :]:
                region.cleanup()
        for engine_id in ids:
            h.remove_shm(engine_id)
    assert not kept_mapped(caplog)


def test_a_group_that_leaves_a_ranks_part_short_is_refused() -> None:
    """With two workers each rank's part must be what the group covers."""
    gpu = [torch.zeros(BLOCKS, h.PAGE, dtype=torch.int8) for _ in range(h.LAYERS)]
    caches = _canonical(gpu, [list(range(h.LAYERS // 2))])  # half the tensors
    engine_id = h.new_engine_id()
    region = SharedOffloadRegion(engine_id, CHUNKS, 0, WORLD * PART, PART)
    try:
        with pytest.raises(ValueError, match="a KV group covers fewer"):
            KvtiersSwapWorker(caches, region, 1, rank=0, world_size=WORLD)
    finally:
        region.cleanup()
        h.remove_shm(engine_id)
