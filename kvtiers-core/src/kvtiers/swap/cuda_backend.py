"""The swapper on a CUDA device: its own streams (one for stores, one for loads, so
the two directions overlap), completion by events, one native call per job (per
staging chunk for `staged`), never a Python loop over blocks.

Methods (see `kvtiers.swap.methods` for how one is chosen per job):

- `dma`: every coalesced run of the job in one `cuMemcpyBatchAsync` (copy engines,
  no SM time). Large runs (cross-layer blocks) reach the link's speed this way.
- `kernel`: the Triton copy kernel with a small grid, straight between GPU pages and
  the pool's mapped pinned memory. For small fragments; costs `kernel_grid` CTAs.
- `staged`: a full-grid Triton kernel gathers the job's fragments into a GPU staging
  buffer in canonical order (or scatters them out of it), and one
  `cuMemcpyBatchAsync` moves each block's part as one run. The kernel runs at HBM
  speed for a few percent of the transfer time; the link sees only large copies.
  Costs `staging_bytes` of GPU memory per direction, allocated up front.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from kvtiers.pool_pinning import registration_chunks
from kvtiers.swap.cuda_driver import FLAG_PREFER_OVERLAP_WITH_COMPUTE, CudaDriver
from kvtiers.swap.job import Job
from kvtiers.swap.layout import KVLayout
from kvtiers.swap.methods import DMA, KERNEL, STAGED, MethodPolicy
from kvtiers.swap.plan import (
    LOAD,
    PIECE_BYTES,
    STORE,
    Runs,
    coalesce,
    make_runs,
    make_table,
    split_at_boundaries,
    split_runs,
)

log = logging.getLogger(__name__)

__all__ = ["CudaBackend", "CudaOptions"]

_Table = tuple[torch.Tensor, int]
"""A pinned, mapped host buffer a copy kernel reads its table from, and its device
address (see `_HostTables`)."""


@dataclass
class CudaOptions:
    kernel_grid: int = 8
    kernel_words: int = 2048
    kernel_warps: int = 8
    staged_grid: int = 0  # 0: 4 CTAs per SM
    staging_bytes: int = 64 * 1024 * 1024
    stream_priority: int = 0
    dma_flags: int = FLAG_PREFER_OVERLAP_WITH_COMPUTE
    wait_for_compute: bool = True


@dataclass
class _Group:
    layout: KVLayout
    pool: torch.Tensor
    slot_bytes: int
    host_base: int  # the pool's host address
    mapped_base: int | None  # its device address when mapped
    regions: np.ndarray  # int64 device addresses of the layout's regions
    kernel_ok: bool  # every fragment is in whole 8-byte words
    # (offset of the first registration edge from host_base, registration step), when
    # the pool was registered in chunks: no DMA may span two registrations.
    chunks: tuple[int, int] | None = None

    def cut(self, runs: Runs) -> Runs:
        """`runs` cut at the pool's registration edges (a no-op for one registration)."""
        if self.chunks is None:
            return runs
        return split_at_boundaries(runs, *self.chunks)


class CudaBackend:
    kind = "cuda"

    def __init__(
        self,
        groups: list[tuple[KVLayout, torch.Tensor]],
        rank: int,
        device: torch.device,
        policy: MethodPolicy,
        options: CudaOptions,
    ):
        self.device = device
        self._rank = rank
        self._opt = options
        self._policy = policy
        self._driver = CudaDriver(
            device.index if device.index is not None else torch.cuda.current_device()
        )
        self._driver.ensure_context()
        self._groups: list[_Group] = []
        for layout, pool in groups:
            if not pool.is_pinned():
                raise ValueError(
                    "the CPU pool is not registered with CUDA (pinned): DMA from pageable "
                    "memory would block the engine; create or attach the pool with pin=True"
                )
            host = pool.data_ptr()
            mapped = self._driver.host_device_pointer(host)
            word_ok = layout.word_bytes() % 8 == 0 and pool.shape[1] % 8 == 0
            reg = registration_chunks(host)
            chunks = None if reg is None else (reg[0] - host, reg[1])
            self._groups.append(_Group(
                layout, pool, pool.shape[1], host, mapped, layout.region_addresses, word_ok,
                chunks,
            ))  # fmt: skip
        self._triton = _import_triton()
        self.available = self._available_methods()
        if not self.available:
            raise RuntimeError(
                "no copy method is usable: cuMemcpyBatchAsync needs a CUDA 12.8+ driver "
                f"(found {self._driver.driver_version}) and the kernel needs Triton "
                "and a mapped pool (cudaHostRegisterMapped)"
            )
        self._policy.restrict(self.available)
        self._streams = {
            # torch's stubs leave Stream.__new__ untyped
            d: torch.cuda.Stream(device, priority=options.stream_priority)  # type: ignore[no-untyped-call]
            for d in (STORE, LOAD)
        }
        self._staging: dict[str, torch.Tensor] = {}
        if STAGED in self.available and options.staging_bytes > 0:
            for d in (STORE, LOAD):
                self._staging[d] = torch.empty(
                    options.staging_bytes, dtype=torch.uint8, device=device
                )
        self._sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        self._pending: deque[Job] = deque()
        self._tables = _HostTables(self._driver)

    def _available_methods(self) -> tuple[str, ...]:
        methods = []
        if self._driver.batch_available:
            methods.append(DMA)
        kernel_ok = self._triton and all(g.kernel_ok for g in self._groups)
        if kernel_ok and all(g.mapped_base is not None for g in self._groups):
            methods.append(KERNEL)
        staging_fits = all(g.layout.rank_bytes <= self._opt.staging_bytes for g in self._groups)
        if kernel_ok and self._driver.batch_available and staging_fits:
            methods.append(STAGED)
        return tuple(methods)

    # ---------------------------------------------------------------- contract

    def submit(self, job: Job, method: str) -> None:
        """Queue the job's copies on its direction's stream (behind the caller's
        current stream's work when `wait_for_compute`) and return."""
        g = self._groups[job.group]
        stream = self._streams[job.direction]
        check = job.check
        # torch's stubs leave Event.__new__ untyped
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        keep: list[object] = []
        tables: list[_Table] = []
        compute = torch.cuda.current_stream(self.device)
        try:
            self._driver.ensure_context()
            with torch.cuda.stream(stream):
                if self._opt.wait_for_compute:
                    stream.wait_stream(compute)
                start.record(stream)
                try:
                    layout = g.layout
                    pool_offsets = check.slots * g.slot_bytes + self._rank * layout.rank_bytes
                    n_runs = len(pool_offsets) * layout.runs_per_block
                    method = self._policy.choose(method, n_runs, job.nbytes)
                    job.method = method
                    if method == DMA:
                        runs = g.cut(make_runs(layout, check.pages, pool_offsets))
                        self._dma(g, runs, job.direction, stream, keep)
                    elif method == KERNEL:
                        runs = make_runs(layout, check.pages, pool_offsets)
                        self._kernel(g, runs, job.direction, keep, tables)
                    else:
                        self._staged(
                            g, check.pages, pool_offsets, job.direction, stream, keep, tables
                        )
                finally:
                    # Always: the job is only reported once whatever was queued ran.
                    end.record(stream)
        except Exception as e:
            log.warning("swap job %s (%s) failed to queue: %r", job.job_id, method, e)
            job.error = f"{type(e).__name__}: {e}"
        job.payload = (start, end, keep, tables)
        self._pending.append(job)

    def poll(self) -> list[Job]:
        done = []
        for _ in range(len(self._pending)):
            job = self._pending.popleft()
            if self._finished(job):
                done.append(job)
            else:
                self._pending.append(job)
        return done

    def wait(self, job: Job, timeout: float | None) -> bool:
        """Block until `job` ran (True) or `timeout` seconds passed (False)."""
        end = job.payload[1]
        if timeout is None:
            try:
                end.synchronize()
            except Exception as e:  # a device fault: the job failed, poll reports it
                job.error = job.error or f"{type(e).__name__}: {e}"
            return True
        deadline = time.monotonic() + timeout
        while not self._query(job):
            if time.monotonic() >= deadline:
                return False
            time.sleep(50e-6)
        return True

    def close(self) -> None:
        """Wait for every queued copy (DMA into memory about to be unmapped must not
        run late), then drop the staging buffers."""
        for job in list(self._pending):
            self.wait(job, None)
        self._staging.clear()

    # ---------------------------------------------------------------- methods

    def _dma(
        self,
        g: _Group,
        runs: Runs,
        direction: str,
        stream: torch.cuda.Stream,
        keep: list[object],
    ) -> None:
        engine = (g.regions[runs.region] + runs.engine).astype(np.uint64)
        host = (g.host_base + runs.buffer).astype(np.uint64)
        sizes = runs.length.astype(np.uint64)
        to_host = direction == STORE
        dst, src = (host, engine) if to_host else (engine, host)
        keep += [dst, src, sizes]
        self._driver.memcpy_batch(
            dst, src, sizes, stream.cuda_stream, to_host=to_host, flags=self._opt.dma_flags
        )

    def _kernel(
        self, g: _Group, runs: Runs, direction: str, keep: list[object], tables: list[_Table]
    ) -> None:
        assert g.mapped_base is not None
        pieces = split_runs(runs, PIECE_BYTES)
        engine = g.regions[pieces.region] + pieces.engine
        host = g.mapped_base + pieces.buffer
        src, dst = (engine, host) if direction == STORE else (host, engine)
        table = make_table(src, dst, pieces.length)
        self._launch(table, self._opt.kernel_grid, keep, tables, small_grid=True)

    def _staged(
        self,
        g: _Group,
        pages: np.ndarray,
        pool_offsets: np.ndarray,
        direction: str,
        stream: torch.cuda.Stream,
        keep: list[object],
        tables: list[_Table],
    ) -> None:
        staging = self._staging[direction]
        base = staging.data_ptr()
        rank_bytes = g.layout.rank_bytes
        per = len(staging) // rank_bytes
        grid = self._opt.staged_grid or 4 * self._sm_count
        to_host = direction == STORE
        flags = self._opt.dma_flags
        for c in range(0, len(pool_offsets), per):  # staging-buffer chunks, not blocks
            k = min(per, len(pool_offsets) - c)
            stage_offsets = np.arange(k, dtype=np.int64) * rank_bytes
            frag = split_runs(make_runs(g.layout, pages[c : c + k], stage_offsets), PIECE_BYTES)
            engine = g.regions[frag.region] + frag.engine
            staged = base + frag.buffer
            # One run per block between the staging buffer and its slot; consecutive
            # slots merge into one.
            big = g.cut(
                coalesce(
                    Runs(
                        np.zeros(k, np.int64),
                        base + stage_offsets,
                        pool_offsets[c : c + k],
                        np.full(k, rank_bytes, np.int64),
                    )
                )
            )
            big = Runs(big.region, big.engine, g.host_base + big.buffer, big.length)
            dev_side = big.engine.astype(np.uint64)
            host_side = big.buffer.astype(np.uint64)
            sizes = big.length.astype(np.uint64)
            keep += [dev_side, host_side, sizes]
            cs = stream.cuda_stream
            if to_host:
                self._launch(make_table(engine, staged, frag.length), grid, keep, tables)
                self._driver.memcpy_batch(host_side, dev_side, sizes, cs, to_host=True, flags=flags)
            else:
                self._driver.memcpy_batch(
                    dev_side, host_side, sizes, cs, to_host=False, flags=flags
                )
                self._launch(make_table(staged, engine, frag.length), grid, keep, tables)

    def _launch(
        self,
        table: np.ndarray,
        grid: int,
        keep: list[object],
        tables: list[_Table],
        *,
        small_grid: bool = False,
    ) -> None:
        from kvtiers.swap.triton_copy import launch_copy  # Triton: only when used

        host, address = self._tables.take(table.size)
        tables.append((host, address))
        on_device = launch_copy(
            table, grid, host, address, device=self.device if small_grid else None,
            words=self._opt.kernel_words, num_warps=self._opt.kernel_warps,
        )  # fmt: skip
        if on_device is not None:
            keep.append(on_device)

    # ---------------------------------------------------------------- internal

    def _query(self, job: Job) -> bool:
        end = job.payload[1]
        try:
            return bool(end.query())
        except Exception as e:  # sticky device error: report, never raise
            job.error = job.error or f"{type(e).__name__}: {e}"
            return True

    def _finished(self, job: Job) -> bool:
        if not self._query(job):
            return False
        start, end, _, tables = job.payload
        try:
            job.seconds = start.elapsed_time(end) / 1e3
        except Exception:
            job.seconds = time.perf_counter() - job.started
        self._tables.give(tables)  # the copies ran: their tables may be reused
        job.payload = None
        job.done.set()
        return True


class _HostTables:
    """Pinned, mapped buffers the copy kernels read their tables from, reused once
    the job that used them ended (a fresh pinned allocation per job would cost far
    more than the kernel)."""

    def __init__(self, driver: CudaDriver) -> None:
        self._driver = driver
        self._free: list[_Table] = []

    def take(self, n: int) -> _Table:
        """A buffer of at least `n` int64 and its device address."""
        for i, (t, _) in enumerate(self._free):
            if t.numel() >= n:
                return self._free.pop(i)
        size = 1 << max(12, (n - 1).bit_length())
        t = torch.empty(size, dtype=torch.int64, pin_memory=True)
        address = self._driver.host_device_pointer(t.data_ptr())
        if address is None:
            raise RuntimeError("pinned memory is not mapped into the device's address space")
        return t, address

    def give(self, buffers: list[_Table]) -> None:
        self._free.extend(buffers)
        if len(self._free) > 64:  # a bounded cache: keep the largest
            self._free.sort(key=lambda b: b[0].numel())
            del self._free[:-64]


def _import_triton() -> bool:
    try:
        import triton  # noqa: F401
    except Exception as e:
        log.info("Triton unavailable (%r): the kernel and staged methods are off", e)
        return False
    return True
