"""What the CUDA backend keeps per group and reuses across jobs: DMA descriptor
arrays, timing events, pinned kernel tables; and the Triton kernel behind the same
`launch` as the NVRTC one. Used from the swapper's submitting thread only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvtiers.swap.cuda_driver import CudaDriver
from kvtiers.swap.layout import KVLayout
from kvtiers.swap.plan import Runs, split_at_boundaries
from kvtiers.swap.planner import GroupPlanner

if TYPE_CHECKING:  # imported where used: kvtiers.swap imports without torch
    import torch

__all__ = ["Descriptors", "EventPool", "Group", "HostTables", "Table", "TritonKernel"]

Table = tuple["torch.Tensor", int]
"""A pinned, mapped host buffer a copy kernel reads its table from, and its device
address (see `HostTables`)."""


class Descriptors:
    """Reused uint64 arrays for `cuMemcpyBatchAsync`'s three descriptor arrays (the
    driver reads them during the call only), with their addresses."""

    def __init__(self) -> None:
        self._grow(256)

    def _grow(self, n: int) -> None:
        self._arrays = [np.empty(n, np.int64) for _ in range(3)]
        self._addr = tuple(int(a.ctypes.data) for a in self._arrays)

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]]:
        if n > len(self._arrays[0]):
            self._grow(1 << (n - 1).bit_length())
        a = self._arrays
        return a[0], a[1], a[2], self._addr


class EventPool:
    """Driver events (with timing) reused across jobs: a job records two, and gives
    them back once it was seen finished."""

    def __init__(self, driver: CudaDriver) -> None:
        self._driver = driver
        self._free: list[int] = []

    def take(self) -> int:
        return self._free.pop() if self._free else self._driver.event_create()

    def give(self, *events: int) -> None:
        self._free.extend(events)


class HostTables:
    """Pinned, mapped buffers the copy kernels read their tables from, reused once
    the job that used them ended (a fresh pinned allocation per job would cost far
    more than the kernel)."""

    def __init__(self, driver: CudaDriver) -> None:
        self._driver = driver
        self._free: list[Table] = []

    def take(self, n: int) -> Table:
        """A buffer of at least `n` int64 and its device address."""
        for i, (t, _) in enumerate(self._free):
            if t.numel() >= n:
                return self._free.pop(i)
        size = 1 << max(12, (n - 1).bit_length())
        import torch

        t = torch.empty(size, dtype=torch.int64, pin_memory=True)
        address = self._driver.host_device_pointer(t.data_ptr())
        if address is None:
            raise RuntimeError("pinned memory is not mapped into the device's address space")
        return t, address

    def give(self, buffers: list[Table]) -> None:
        self._free.extend(buffers)
        if len(self._free) > 64:  # a bounded cache: keep the largest
            self._free.sort(key=lambda b: b[0].numel())
            del self._free[:-64]


class TritonKernel:
    """The Triton copy kernel behind the NVRTC kernel's `launch` (fallback): it runs
    on torch's current stream, so each launch switches to the job's stream."""

    def __init__(self, device: torch.device, words: int, num_warps: int) -> None:
        self._device = device
        self._words = words
        self._warps = num_warps
        self._streams: dict[int, torch.cuda.ExternalStream] = {}

    def launch(self, table_address: int, n: int, grid: int, stream: int) -> None:
        import torch

        from kvtiers.swap.triton_copy import launch_table  # Triton: only when used

        s = self._streams.get(stream)
        if s is None:
            s = torch.cuda.ExternalStream(stream, device=self._device)  # type: ignore[no-untyped-call]
            self._streams[stream] = s
        with torch.cuda.stream(s):
            launch_table(table_address, n, grid, words=self._words, num_warps=self._warps)


@dataclass
class Group:
    """One KV group as the CUDA backend keeps it."""

    layout: KVLayout
    pool: torch.Tensor
    slot_bytes: int
    host_base: int  # the pool's host address
    mapped_base: int | None  # its device address when mapped
    planner: GroupPlanner
    kernel_ok: bool  # every fragment is in whole 8-byte words
    # (offset of the first registration edge from host_base, registration step), when
    # the pool was registered in chunks: no DMA may span two registrations.
    chunks: tuple[int, int] | None = None

    def cut(
        self, engine: np.ndarray, buffer: np.ndarray, length: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Runs (buffer offsets from host_base) cut at the pool's registration edges
        (a no-op for one registration)."""
        if self.chunks is None:
            return engine, buffer, length
        r = split_at_boundaries(Runs(np.zeros_like(length), engine, buffer, length), *self.chunks)
        return r.engine, r.buffer, r.length
