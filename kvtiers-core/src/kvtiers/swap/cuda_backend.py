"""The swapper on a CUDA device: its own streams (per direction, so the two overlap),
completion by events, a few driver calls per job (per staging chunk for `staged`),
never a Python loop over blocks.

Methods (see `kvtiers.swap.methods` for how one is chosen per job):

- `dma`: every coalesced run of the job in one `cuMemcpyBatchAsync` (copy engines,
  no SM time). Large runs (cross-layer blocks) reach the link's speed this way.
- `kernel`: the copy kernel with a small grid, straight between GPU pages and the
  pool's mapped pinned memory. For small fragments; costs `kernel_grid` CTAs.
- `staged`: a full-grid copy kernel gathers the job's fragments into a GPU staging
  region in canonical order (or scatters them out of it), and one
  `cuMemcpyBatchAsync` moves each block's part as one run; kernels and copies run on
  two streams through a ring of regions (`kvtiers.swap.staging`), so they overlap.
  Costs `staging_bytes` of GPU memory per direction, allocated up front.

Host time per job is what limits small jobs (a 16-block job moves in ~0.6 ms), so
the submit path makes only driver calls through prepared ctypes entry points
(events from a pool, `cuStreamWaitEvent` for `wait_for_compute`, `cuLaunchKernel`
of an NVRTC-compiled kernel on the job's stream, no torch stream switch), plans with
the group's precomputed templates (`kvtiers.swap.planner`) and writes the DMA
descriptors into reused arrays. Triton is the kernel's fallback where NVRTC is
missing (`kvtiers.swap.triton_copy`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvtiers.pool.pinning import registration_chunks
from kvtiers.swap.cuda_driver import FLAG_PREFER_OVERLAP_WITH_COMPUTE, CudaDriver
from kvtiers.swap.cuda_resources import (
    Descriptors,
    EventPool,
    Group,
    HostTables,
    Table,
    TritonKernel,
)  # fmt: skip
from kvtiers.swap.layout import KVLayout
from kvtiers.swap.methods import DMA, KERNEL, STAGED, MethodPolicy
from kvtiers.swap.plan import LOAD, STORE
from kvtiers.swap.planner import GroupPlanner, coalesce_arrays
from kvtiers.swap.staging import StagingRing
from kvtiers.swap.swap_job import SwapJob

log = logging.getLogger(__name__)

__all__ = ["CudaBackend", "CudaOptions"]

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
    use_nvrtc: bool = True  # False: the Triton kernel (diagnostics, fallback tests)


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
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._rank = rank
        self._opt = options
        self._policy = policy
        self._driver = CudaDriver(self._index)
        self._driver.ensure_context()
        self._groups: list[Group] = []
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
            planner = GroupPlanner(layout, layout.region_addresses)
            self._groups.append(Group(
                layout, pool, pool.shape[1], host, mapped, planner, word_ok, chunks,
            ))  # fmt: skip
        self._kernel = self._load_kernel()
        self.available = self._available_methods()
        if not self.available:
            raise RuntimeError(
                "no copy method is usable: cuMemcpyBatchAsync needs a CUDA 12.8+ driver "
                f"(found {self._driver.driver_version}) and the kernel needs NVRTC or "
                "Triton and a mapped pool (cudaHostRegisterMapped)"
            )
        self._policy.restrict(self.available)
        self._streams = {
            # torch's stubs leave Stream.__new__ untyped
            d: torch.cuda.Stream(device, priority=options.stream_priority)  # type: ignore[no-untyped-call]
            for d in (STORE, LOAD)
        }
        self._handles = {d: int(s.cuda_stream) for d, s in self._streams.items()}
        self._staging: dict[str, StagingRing] = {}
        if STAGED in self.available and options.staging_bytes > 0:
            block = max(g.layout.rank_bytes for g in self._groups)
            for d in (STORE, LOAD):
                self._staging[d] = StagingRing(
                    self._driver, device, options.staging_bytes, options.stream_priority, block
                )
        self._stage_cache: dict[tuple[int, str, int], np.ndarray] = {}
        self._sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        self._pending: deque[SwapJob] = deque()
        self._tables = HostTables(self._driver)
        self._events = EventPool(self._driver)
        self._fence = self._driver.event_create(timing=False)  # wait_for_compute's
        self._scratch = Descriptors()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_current = raw if callable(raw) else None

    def _load_kernel(self) -> Any:
        if not all(g.kernel_ok for g in self._groups):
            return None
        if self._opt.use_nvrtc:
            from kvtiers.swap.copy_kernel import load_nvrtc_kernel

            kernel = load_nvrtc_kernel(self._driver)
            if kernel is not None:
                return kernel
        if not _import_triton():
            return None
        return TritonKernel(self.device, self._opt.kernel_words, self._opt.kernel_warps)

    def _available_methods(self) -> tuple[str, ...]:
        methods = []
        if self._driver.batch_available:
            methods.append(DMA)
        kernel_ok = self._kernel is not None
        if kernel_ok and all(g.mapped_base is not None for g in self._groups):
            methods.append(KERNEL)
        staging_fits = all(g.layout.rank_bytes <= self._opt.staging_bytes for g in self._groups)
        if kernel_ok and self._driver.batch_available and staging_fits:
            methods.append(STAGED)
        return tuple(methods)

    # ---------------------------------------------------------------- contract

    def submit(self, job: SwapJob, method: str) -> None:
        """Queue the job's copies on its direction's streams (behind the caller's
        current stream's work when `wait_for_compute`) and return."""
        g = self._groups[job.group]
        direction = job.direction
        check = job.check
        drv = self._driver
        keep: list[object] = []
        tables: list[Table] = []
        drv.ensure_context()
        start, end = self._events.take(), self._events.take()
        layout = g.layout
        pool_offsets = check.slots * g.slot_bytes + self._rank * layout.rank_bytes
        n_runs = len(pool_offsets) * layout.runs_per_block
        copy = self._handles[direction]
        first = last = copy
        try:
            method = self._policy.choose(method, n_runs, job.nbytes)
            job.method = method
            if method == STAGED:  # a store's chain starts on the kernel stream, a load's ends there
                ring = self._staging[direction]
                first, last = (ring.kernel_stream, copy) if direction == STORE else (
                    copy, ring.kernel_stream)  # fmt: skip
            if self._opt.wait_for_compute:
                drv.event_record(self._fence, self._current_stream())
                drv.stream_wait_event(first, self._fence)
            if method != STAGED:  # `_staged` records it at its first copy
                drv.event_record(start, first)
            try:
                if method == DMA:
                    self._dma(g, check.pages, pool_offsets, direction, copy)
                elif method == KERNEL:
                    self._small_kernel(g, check.pages, pool_offsets, direction, copy, keep,
                                       tables)  # fmt: skip
                else:
                    self._staged(g, check.pages, pool_offsets, direction, tables, start)
            except Exception:
                if first != last:  # what was queued on `first` must end before `end`
                    drv.event_record(self._fence, first)
                    drv.stream_wait_event(last, self._fence)
                if method == STAGED:  # `start` may not be recorded yet: a failed job's time
                    drv.event_record(start, last)
                raise
            finally:
                # Always: the job is only reported once whatever was queued ran.
                drv.event_record(end, last)
        except Exception as e:  # noqa: BLE001 - in the job's result, never raised
            log.warning("swap job %s (%s) failed to queue: %r", job.job_id, method, e)
            job.error = f"{type(e).__name__}: {e}"
        job.payload = (start, end, keep, tables)
        self._pending.append(job)

    def poll(self) -> list[SwapJob]:
        done = []
        for _ in range(len(self._pending)):
            job = self._pending.popleft()
            if self._finished(job):
                done.append(job)
            else:
                self._pending.append(job)
        return done

    def wait(self, job: SwapJob, timeout: float | None) -> bool:
        """Block until `job` ran (True) or `timeout` seconds passed (False)."""
        if job.payload is None:
            return True
        end = job.payload[1]
        if timeout is None:
            try:
                self._driver.event_synchronize(end)
            except Exception as e:  # noqa: BLE001 - a device fault: poll reports it
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

    def _current_stream(self) -> int:
        if self._raw_current is not None:
            return int(self._raw_current(self._index))
        return int(torch.cuda.current_stream(self.device).cuda_stream)

    def _dma(
        self, g: Group, pages: np.ndarray, pool_offsets: np.ndarray, direction: str, stream: int
    ) -> None:
        engine, buffer, length = g.cut(*plan_runs(g.planner, pages, pool_offsets))
        to_host = direction == STORE
        self._batch(engine, buffer + g.host_base, length, to_host, stream)

    def _batch(
        self, dev: np.ndarray, host: np.ndarray, length: np.ndarray, to_host: bool, stream: int
    ) -> None:
        n = len(length)
        d, s, z, addr = self._scratch.take(n)
        d[:n], s[:n] = (host, dev) if to_host else (dev, host)
        z[:n] = length
        self._driver.memcpy_batch(
            addr[0], addr[1], addr[2], stream, to_host=to_host, flags=self._opt.dma_flags,
            count=n,
        )  # fmt: skip

    def _small_kernel(
        self,
        g: Group,
        pages: np.ndarray,
        pool_offsets: np.ndarray,
        direction: str,
        stream: int,
        keep: list[object],
        tables: list[Table],
    ) -> None:
        assert g.mapped_base is not None
        engine, buffer, words = plan_pieces(g.planner, pages, pool_offsets)
        host = buffer + g.mapped_base
        src, dst = (engine, host) if direction == STORE else (host, engine)
        table, address = self._table(src, dst, words, tables)
        # A small grid waits a bus round trip per piece if it reads its table from host
        # memory: copy it to the device first (on the job's stream).
        on_device = torch.empty(table.numel(), dtype=torch.int64, device=self.device)
        keep.append(on_device)
        n = len(words)
        self._driver.copy_to_device(on_device.data_ptr(), table.data_ptr(), 24 * n, stream)
        self._kernel.launch(on_device.data_ptr(), n, self._opt.kernel_grid, stream)

    def _staged(
        self,
        g: Group,
        pages: np.ndarray,
        pool_offsets: np.ndarray,
        direction: str,
        tables: list[Table],
        start: int,
    ) -> None:
        """Chunks of the job through the staging ring (see `kvtiers.swap.staging`).
        The job's `start` event is recorded on the copy stream as its first copy
        begins: a job's seconds are its time on the link (gathers of later chunks
        overlap earlier copies, so the time from the first gather would count the
        previous job's copies too)."""
        ring = self._staging[direction]
        drv = self._driver
        rank_bytes = g.layout.rank_bytes
        per = ring.blocks_per_region(rank_bytes)
        grid = self._opt.staged_grid or 4 * self._sm_count
        copy, kern = self._handles[direction], ring.kernel_stream
        planner = g.planner
        block_index = np.arange(per, dtype=np.int64) * rank_bytes
        for c in range(0, len(pool_offsets), per):  # staging-region chunks, not blocks
            k = min(per, len(pool_offsets) - c)
            r = ring.take()
            staged_all = self._staged_addresses(g, direction, r, ring.bases[r], per)
            engine, _, words = plan_pieces(planner, pages[c : c + k], pool_offsets[:k])
            staged = staged_all[: len(words)]
            # One run per block between the staging region and its slot; consecutive
            # slots merge into one.
            dev, host, length = g.cut(*coalesce_arrays(
                block_index[:k] + ring.bases[r], pool_offsets[c : c + k],
                np.full(k, rank_bytes, np.int64),
            ))  # fmt: skip
            host = host + g.host_base
            # The kernel reads its table from pinned mapped memory: a copy to the device
            # would queue behind the other direction's large copies.
            if direction == STORE:
                _, address = self._table(engine, staged, words, tables)
                drv.stream_wait_event(kern, ring.free[r])
                self._kernel.launch(address, len(words), grid, kern)
                drv.event_record(ring.ready[r], kern)
                drv.stream_wait_event(copy, ring.ready[r])
                if c == 0:
                    drv.event_record(start, copy)
                self._batch(dev, host, length, True, copy)
                drv.event_record(ring.free[r], copy)
            else:
                drv.stream_wait_event(copy, ring.free[r])
                if c == 0:
                    drv.event_record(start, copy)
                self._batch(dev, host, length, False, copy)
                drv.event_record(ring.ready[r], copy)
                _, address = self._table(staged, engine, words, tables)
                drv.stream_wait_event(kern, ring.ready[r])
                self._kernel.launch(address, len(words), grid, kern)
                drv.event_record(ring.free[r], kern)

    def _staged_addresses(
        self, g: Group, direction: str, region: int, base: int, per: int
    ) -> np.ndarray:
        """Device addresses of every kernel piece of `per` blocks in a staging
        region, in canonical order (the same for every job of the group)."""
        key = (id(g), direction, region)
        cached = self._stage_cache.get(key)
        if cached is None:
            offsets = np.arange(per, dtype=np.int64) * g.layout.rank_bytes + base
            cached = g.planner.pieces.buffer(offsets)
            self._stage_cache[key] = cached
        return cached

    def _table(
        self, src: np.ndarray, dst: np.ndarray, words: np.ndarray, tables: list[Table]
    ) -> Table:
        """The kernel's `[3, n]` table written straight into a pinned mapped buffer
        (kept in `tables` until the job ends)."""
        n = len(words)
        host, address = self._tables.take(3 * n)
        tables.append((host, address))
        t = host.numpy()
        t[:n] = src
        t[n : 2 * n] = dst
        t[2 * n : 3 * n] = words
        return host, address

    # ---------------------------------------------------------------- internal

    def _query(self, job: SwapJob) -> bool:
        try:
            return self._driver.event_done(job.payload[1])
        except Exception as e:  # noqa: BLE001 - sticky device error: report, never raise
            job.error = job.error or f"{type(e).__name__}: {e}"
            return True

    def _finished(self, job: SwapJob) -> bool:
        if job.payload is None:
            return True
        if not self._query(job):
            return False
        start, end, _, tables = job.payload
        try:
            job.seconds = self._driver.event_seconds(start, end)
        except Exception:  # noqa: BLE001 - timing only: fall back to the host clock
            job.seconds = time.perf_counter() - job.started
        self._tables.give(tables)  # the copies ran: their tables may be reused
        self._events.give(start, end)
        job.payload = None
        job.done.set()
        return True


def plan_runs(
    planner: GroupPlanner, pages: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The DMA runs of a job (a module function, so tests can make planning fail)."""
    return planner.runs(pages, offsets)


def plan_pieces(
    planner: GroupPlanner, pages: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel pieces of a job (as `plan_runs`)."""
    return planner.piece_runs(pages, offsets)


def _import_triton() -> bool:
    try:
        import triton  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure: Triton is off
        log.info("Triton unavailable (%r): the kernel and staged methods are off", e)
        return False
    return True
