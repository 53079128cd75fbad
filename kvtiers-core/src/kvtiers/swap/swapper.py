"""`DeviceSwapper`: the worker side's data path between the engine's KV cache and the
CPU pool.

Who calls what: the engine's worker (one swapper per GPU, one thread) submits store
jobs (GPU pages -> pool slots) and load jobs (slots -> GPU pages) and polls
`get_finished()` once per step; nothing it calls waits for a copy, except `wait()`
and `close()`. Each job reports exactly once, as a `SwapResult` (a `JobResult`).

This module imports torch only when a swapper is built: without it, constructing one
raises `MissingExtraError` naming the extra (`kvtiers-core[torch]`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvtiers.extras import missing_torch
from kvtiers.swap.layout import KVLayout
from kvtiers.swap.methods import (
    AUTO,
    DEFAULT_DMA_MAX_RUNS,
    DEFAULT_DMA_MIN_RUN_BYTES,
    STAGED,
    MethodPolicy,
)
from kvtiers.swap.plan import LOAD, STORE, BlockCheck, check_blocks
from kvtiers.swap.swap_job import SwapJob, SwapResult, SwapStats

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

__all__ = ["DeviceSwapper"]


class DeviceSwapper:
    """Moves blocks between the engine's KV tensors (described by `layout`) and a CPU
    pool (`pool_tensor`: `CpuPool.tensor()`, uint8 `[num_slots, slot_bytes]`, or
    the `CpuPool` itself). This rank writes and reads its own part of each slot.

    Several KV groups: pass a list of layouts and a list of pools (one per group; a
    pool may serve several groups of one block size) and name the group per job.

    On CUDA tensors the copies run on the swapper's own streams (see
    `kvtiers.swap.cuda_backend` for the methods); on CPU tensors on two threads.
    Options (CUDA): `method` (`auto`, `dma`, `kernel`, `staged`), `small_method`
    (what `auto` uses for fragmented jobs), `dma_min_run_bytes`, `dma_max_runs`,
    `kernel_grid` (CTAs of the mapped-memory kernel), `staging_bytes` (GPU memory
    per direction for `staged`; 0 turns it off), `staged_grid` (CTAs of its
    gather/scatter kernel; default 4 per SM), `wait_for_compute` (a job first
    waits for the submitting thread's current stream, so a store sees the KV the
    model just wrote). CPU: `cpu_chunk_bytes` (the copy buffer).

    Not thread-safe: call from one thread. `close()` waits for copies in flight.
    """

    def __init__(
        self,
        layout: KVLayout | Sequence[KVLayout],
        pool_tensor: Any,
        rank: int = 0,
        *,
        method: str = AUTO,
        small_method: str = STAGED,
        dma_min_run_bytes: int = DEFAULT_DMA_MIN_RUN_BYTES,
        dma_max_runs: int = DEFAULT_DMA_MAX_RUNS,
        kernel_grid: int | None = None,
        staging_bytes: int | None = None,
        staged_grid: int | None = None,
        stream_priority: int = 0,
        wait_for_compute: bool = True,
        cpu_chunk_bytes: int | None = None,
    ):
        try:
            import torch
        except ImportError as exc:
            raise missing_torch("DeviceSwapper", exc) from exc

        layouts = [layout] if isinstance(layout, KVLayout) else list(layout)
        pools = pool_tensor if isinstance(pool_tensor, (list, tuple)) else [pool_tensor]
        pools = [
            p.tensor() if hasattr(p, "tensor") and not isinstance(p, torch.Tensor) else p
            for p in pools
        ]
        if len(pools) == 1 and len(layouts) > 1:
            pools = pools * len(layouts)
        if len(pools) != len(layouts):
            raise ValueError(f"{len(layouts)} KV groups but {len(pools)} pools")
        if not layouts:
            raise ValueError("need at least one layout")
        device = layouts[0].device
        for i, (lay, pool) in enumerate(zip(layouts, pools, strict=True)):
            _check_group(i, lay, pool, rank, device)
        self.layouts = layouts
        self.rank = rank
        self.device = device
        self.policy = MethodPolicy(
            method, small_method=small_method,
            dma_min_run_bytes=dma_min_run_bytes, dma_max_runs=dma_max_runs,
        )  # fmt: skip
        groups = list(zip(layouts, pools, strict=True))
        if device.type == "cuda":
            from kvtiers.swap.cuda_backend import CudaBackend, CudaOptions

            opt = CudaOptions(stream_priority=stream_priority, wait_for_compute=wait_for_compute)
            if kernel_grid is not None:
                opt.kernel_grid = kernel_grid
            if staging_bytes is not None:
                opt.staging_bytes = staging_bytes
            if staged_grid is not None:
                opt.staged_grid = staged_grid
            self._backend: Any = CudaBackend(groups, rank, device, self.policy, opt)
        elif device.type == "cpu":
            from kvtiers.swap.cpu_backend import DEFAULT_CHUNK_BYTES, CpuBackend

            self._backend = CpuBackend(groups, rank, cpu_chunk_bytes or DEFAULT_CHUNK_BYTES)
        else:
            raise ValueError(f"no swapper backend for device {device}")
        self._num_slots = [int(p.shape[0]) for p in pools]
        self._jobs: dict[int, SwapJob] = {}
        self._ready: deque[SwapJob] = deque()
        self._stats = SwapStats()
        self._closed = False

    # ---------------------------------------------------------------- contract

    @property
    def methods(self) -> tuple[str, ...]:
        """The copy methods this machine can run."""
        return tuple(self._backend.available)

    def submit_store(
        self,
        job_id: int,
        gpu_pages: Any,
        slots: Any,
        *,
        group: int = 0,
        keys: Sequence[Any] | None = None,
        method: str | None = None,
    ) -> None:
        """Copy the blocks in `gpu_pages` (`pages_per_block` pages per block, flat
        or `[blocks, pages_per_block]`) into `slots`. Returns at once; the result
        comes from `get_finished()`. Invalid blocks fail in the result; never raises
        for bad indices (only for a job id already in flight or a bad `group`)."""
        self._submit(job_id, STORE, gpu_pages, slots, group, keys, method)

    def submit_load(
        self,
        job_id: int,
        slots: Any,
        gpu_pages: Any,
        *,
        group: int = 0,
        keys: Sequence[Any] | None = None,
        method: str | None = None,
    ) -> None:
        """Copy the blocks in `slots` into `gpu_pages`; as `submit_store`."""
        self._submit(job_id, LOAD, gpu_pages, slots, group, keys, method)

    def get_finished(self) -> list[SwapResult]:
        """Results of the jobs that ended since the last call. Never blocks, never
        raises for a failed job."""
        done = list(self._ready)
        self._ready.clear()
        done += self._backend.poll()
        results = []
        for job in done:
            self._jobs.pop(job.job_id, None)
            result = job.result()
            self._stats.record(result)
            results.append(result)
        return results

    def wait(self, job_ids: Iterable[int], timeout: float | None = None) -> bool:
        """Block until the given jobs ended (their results still come from
        `get_finished()`); False if `timeout` seconds passed first. Unknown ids
        (already reported, never submitted) count as ended."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is None or job in self._ready:
                continue
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._backend.wait(job, left):
                return False
        return True

    def pending(self) -> int:
        """Jobs submitted and not yet reported."""
        return len(self._jobs)

    def stats(self) -> SwapStats:
        return self._stats

    def close(self) -> None:
        """Wait for the copies in flight, then release the streams' resources.
        Jobs not yet reported are still reported by `get_finished()`; jobs submitted
        afterwards fail with `closed`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._backend.close()

    def __enter__(self) -> DeviceSwapper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internal

    def _submit(
        self,
        job_id: int,
        direction: str,
        pages: Any,
        slots: Any,
        group: int,
        keys: Sequence[Any] | None,
        method: str | None,
    ) -> None:
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} is still in flight")
        if not 0 <= group < len(self.layouts):
            raise ValueError(f"group {group} out of range 0..{len(self.layouts) - 1}")
        if method is not None and method != AUTO:
            self.policy.usable(method)  # an unknown or impossible method is a caller bug
        layout = self.layouts[group]
        try:
            check = check_blocks(layout, self._num_slots[group], pages, slots, direction)
        except (TypeError, ValueError) as e:
            n = len(keys) if keys is not None else _count(slots)
            check = _all_invalid(n, layout.pages_per_block, f"bad job: {e}")
        if keys is not None and len(keys) != check.n_blocks:
            check = _all_invalid(
                len(keys), layout.pages_per_block,
                f"{len(keys)} keys for {check.n_blocks} blocks",
            )  # fmt: skip
        nbytes = len(check.slots) * layout.rank_bytes
        job = SwapJob(job_id, direction, group, keys, check, nbytes)
        self._jobs[job_id] = job
        if self._closed:
            job.closed = True
            self._ready.append(job)
            return
        if len(check.slots) == 0:
            job.done.set()
            self._ready.append(job)
            return
        self._backend.submit(job, method)


def _check_group(i: int, layout: KVLayout, pool: Any, rank: int, device: torch.device) -> None:
    import torch  # imported by the caller already

    if not isinstance(pool, torch.Tensor) or pool.dtype != torch.uint8 or pool.dim() != 2:
        raise TypeError(f"group {i}: the pool must be a uint8 tensor [num_slots, slot_bytes]")
    if pool.device.type != "cpu":
        raise ValueError(f"group {i}: the pool must be in CPU memory, not on {pool.device}")
    if not pool.is_contiguous():
        raise ValueError(f"group {i}: the pool tensor must be contiguous")
    if layout.device != device:
        raise ValueError(f"group {i}: KV tensors on {layout.device}, group 0's on {device}")
    if not 0 <= rank < layout.tp_size:
        raise ValueError(f"rank {rank} out of range for tp_size {layout.tp_size}")
    if pool.shape[1] < layout.block_bytes:
        raise ValueError(
            f"group {i}: slots of {pool.shape[1]} bytes cannot hold a block of "
            f"{layout.block_bytes} bytes ({layout.describe()})"
        )


def _count(values: Any) -> int:
    try:
        return len(values)
    except TypeError:
        return 0


def _all_invalid(n: int, pages_per_block: int, problem: str) -> BlockCheck:
    import numpy as np

    return BlockCheck(
        n,
        np.zeros(n, bool),
        np.empty((0, pages_per_block), np.int64),
        np.empty(0, np.int64),
        problem,
    )
