"""A copy kernel over a table of (source, destination, length) pieces.

One kernel serves two methods:

- `kernel`: a *small grid* (a few CTAs) copies straight between GPU memory and the
  pool's pinned host memory, which is mapped into the device's address space
  (registered with cudaHostRegisterMapped; addresses from cuMemHostGetDevicePointer).
  PCIe is latency-bound: a handful of CTAs, each keeping a block of loads in flight,
  saturate the link, and the rest of the GPU stays with the model.
- `staged`: a full grid gathers scattered fragments into a contiguous staging buffer
  in GPU memory (or scatters them out of it) at HBM speed, so the copy engines only
  see one large run per block.

Programs take pieces round-robin (the table is cut into equal pieces on the host, so
the share is even: `plan.split_runs`, `plan.make_table`). Addresses are byte
addresses of 8-byte words; lengths in words. Imported only
when a CUDA swapper uses a kernel method (or a test runs it in Triton's interpreter).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

__all__ = ["launch_copy"]


# Triton ships no types, and specialises a kernel on its parameters' annotations: they
# stay as Triton expects (none, or tl.constexpr), hence the two ignores.
@triton.jit  # type: ignore[untyped-decorator]
def _copy_pieces(table_address, n, WORDS: tl.constexpr):  # type: ignore[no-untyped-def]
    # The table, int64 [3, n] = source addresses, destination addresses, lengths in
    # words, in device memory or in mapped pinned host memory (see launch_copy).
    table = table_address.to(tl.pointer_type(tl.int64))
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lane = tl.arange(0, WORDS)
    i = pid
    while i < n:
        src = tl.load(table + i).to(tl.pointer_type(tl.int64))
        dst = tl.load(table + n + i).to(tl.pointer_type(tl.int64))
        words = tl.load(table + 2 * n + i)
        start = 0
        while start < words:
            idx = start + lane
            mask = idx < words
            tl.store(dst + idx, tl.load(src + idx, mask=mask), mask=mask)
            start += WORDS
        i += nprog


def launch_copy(
    table: np.ndarray,
    grid: int,
    host: torch.Tensor,
    host_address: int,
    *,
    device: torch.device | None = None,
    words: int = 2048,
    num_warps: int = 8,
) -> torch.Tensor | None:
    """Queue the kernel on the current stream. `host`: a pinned (mapped) int64
    buffer of at least `table.size` elements, at device address `host_address`,
    which must not be reused before the kernel ran.

    Without `device`, the kernel reads the table from there, over the bus: the right
    choice next to large DMA jobs, since a copy of the table would queue on the same
    copy engine as a concurrent job's large copy and wait for it. With `device`, the
    table is first copied to the device (returned; keep it until the kernel ran):
    the right choice for a small grid, whose programs would otherwise wait a bus
    round trip for every piece."""
    n = table.shape[1]
    staged = host[: table.size]
    staged.numpy()[:] = table.reshape(-1)
    on_device = None
    address = host_address
    if device is not None:
        on_device = staged.to(device, non_blocking=True)
        address = on_device.data_ptr()
    _copy_pieces[(max(1, min(grid, n)),)](address, n, WORDS=words, num_warps=num_warps)
    return on_device
