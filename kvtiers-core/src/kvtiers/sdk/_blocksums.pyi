# The optional native helper built from _blocksums.c (see its header comment).
from collections.abc import Sequence

def sum_slots(base: int, stride: int, length: int, count: int, slots: Sequence[int], /
              ) -> list[int]:
    """The XXH3-64 of `length` bytes at base + slot * stride for each slot."""

def land_slots(base: int, stride: int, length: int, count: int, slots: Sequence[int],
               buffers: Sequence[bytes | bytearray | memoryview], /) -> list[int]:
    """Copy each buffer into its slot; each block's XXH3-64."""
