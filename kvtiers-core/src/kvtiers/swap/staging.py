"""The `staged` method's GPU buffers: per direction, a staging buffer cut into
regions used in turn, and a second stream for the gather/scatter kernels, so that
the kernel of one chunk runs while the copy engines move the previous one.

With one stream per direction (before issue 17) a store's gather waited for the
previous chunk's DMA and a load's DMA for the previous scatter: the link idled for
each kernel (~5% of a 32 MiB chunk's time). Now a chunk is

    store:  kernel stream: wait free[r]; gather into region r; record ready[r]
            copy stream:   wait ready[r]; DMA region r -> pool; record free[r]
    load:   copy stream:   wait free[r]; DMA pool -> region r; record ready[r]
            kernel stream: wait ready[r]; scatter region r; record free[r]

`cuStreamWaitEvent` waits for the event's latest record at the time of the call,
and the host issues every wait before the next record of the same event, so two
events per region suffice however many jobs are queued. Regions: two halves of the
buffer where a block fits in half, else the whole buffer.

Used from the swapper's submitting thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtiers.swap.cuda_driver import CudaDriver

if TYPE_CHECKING:  # torch is imported where a ring is built (kvtiers.swap imports without it)
    import torch

__all__ = ["StagingRing"]


class StagingRing:
    """One direction's staging buffer (`nbytes` of GPU memory), its regions and its
    kernel stream."""

    def __init__(
        self, driver: CudaDriver, device: torch.device, nbytes: int, priority: int, block: int
    ):
        import torch

        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        # torch's stubs leave Stream.__new__ untyped
        self._stream = torch.cuda.Stream(device, priority=priority)  # type: ignore[no-untyped-call]
        self.kernel_stream = int(self._stream.cuda_stream)
        n = 2 if nbytes // 2 >= block else 1
        self.region_bytes = nbytes // n
        base = self.buffer.data_ptr()
        self.bases = [base + i * self.region_bytes for i in range(n)]
        self.ready = [driver.event_create(timing=False) for _ in range(n)]
        self.free = [driver.event_create(timing=False) for _ in range(n)]
        self._next = 0

    def take(self) -> int:
        """The region the next chunk uses (in turn)."""
        r = self._next
        self._next = (r + 1) % len(self.bases)
        return r

    def blocks_per_region(self, block_bytes: int) -> int:
        return self.region_bytes // block_bytes
