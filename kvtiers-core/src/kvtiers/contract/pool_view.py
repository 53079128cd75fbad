"""The CPU pool's bytes as tiers see them, without torch.

A pool is `num_slots` slots of `slot_bytes` each; a slot's first `block_bytes` hold
one block. `slot_bytes` is a multiple of 4 KiB and the buffer is page aligned, so
every slot can be used for O_DIRECT I/O and registered for RDMA.
"""

from __future__ import annotations

import ctypes
import mmap

ALIGN = 4096


def round_up(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


class PoolView:
    """Slot-addressed access to a pool buffer. Thread-safe for disjoint slots."""

    def __init__(self, buffer: object, block_bytes: int, slot_bytes: int | None = None):
        mv = memoryview(buffer).cast("B")  # type: ignore[arg-type]
        if mv.readonly:
            raise ValueError("pool buffer must be writable")
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        slot_bytes = round_up(block_bytes) if slot_bytes is None else slot_bytes
        if slot_bytes < block_bytes or slot_bytes % ALIGN:
            raise ValueError(
                f"slot_bytes must be a multiple of {ALIGN} and >= block_bytes "
                f"({block_bytes}), got {slot_bytes}"
            )
        self._buffer = buffer
        self.buffer = mv
        self.block_bytes = block_bytes
        self.slot_bytes = slot_bytes
        self.num_slots = len(mv) // slot_bytes

    @classmethod
    def anonymous(cls, num_slots: int, block_bytes: int) -> PoolView:
        """A private, page-aligned pool in anonymous memory (tests, single process)."""
        slot_bytes = round_up(block_bytes)
        size = max(num_slots * slot_bytes, ALIGN)
        return cls(mmap.mmap(-1, size), block_bytes, slot_bytes)

    def block(self, slot: int) -> memoryview:
        """The writable `block_bytes` of `slot`."""
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} out of range 0..{self.num_slots - 1}")
        start = slot * self.slot_bytes
        return self.buffer[start : start + self.block_bytes]

    @property
    def address(self) -> int:
        """Address of the first byte (for O_DIRECT and RDMA registration)."""
        return ctypes.addressof(ctypes.c_char.from_buffer(self.buffer))

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.slot_bytes
