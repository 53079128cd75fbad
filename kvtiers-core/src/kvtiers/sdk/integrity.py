"""Block checksums: computed by a tier's I/O thread from the bytes it writes, stored
with the block, verified on load before the load reports success.

XXH3-64: ~90 GB/s per core here on 2 MiB blocks (crc32 ~7, sha256 ~2, blake2b
~1.4), so verifying costs far less than the transfer it protects. It detects
corruption, not forgery: peers and stores are trusted not to forge checksums.

`checksum_slots` and `land_slots` take many blocks of a pool at once: in C without
the GIL when the optional `kvtiers.sdk._blocksums` was built (the same XXH3-64, from
the xxhash package's own library), in a Python loop otherwise (or when
`KVTIERS_PURE_PYTHON` is set). A tier landing thousands of 32 KiB blocks per job
spends less time per block that way, and the threads around it run meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import xxhash

from kvtiers.contract.pool_view import PoolView
from kvtiers.native import pure_python_asked


class _Native(Protocol):
    """What `kvtiers.sdk._blocksums` offers (its stub types it)."""

    def sum_slots(self, base: int, stride: int, length: int, count: int,
                  slots: Sequence[int], /) -> list[int]: ...

    def land_slots(self, base: int, stride: int, length: int, count: int,
                   slots: Sequence[int], buffers: Sequence[bytes | bytearray | memoryview],
                   /) -> list[int]: ...


_native: _Native | None = None
if not pure_python_asked():
    try:
        from kvtiers.sdk import _blocksums as _native
    except ImportError:  # not built (no compiler), or an xxhash without its C API
        _native = None

CHECKSUM_BYTES = 8
CHECKSUM_NAME = "xxh3_64"


def checksum(data: bytes | bytearray | memoryview) -> int:
    """The 64-bit checksum of a block's bytes."""
    return xxhash.xxh3_64_intdigest(data)


def checksum_bytes(data: bytes | bytearray | memoryview) -> bytes:
    """The checksum as `CHECKSUM_BYTES` little-endian bytes, for headers and wire."""
    return checksum(data).to_bytes(CHECKSUM_BYTES, "little")


def verify(data: bytes | bytearray | memoryview, expected: int | bytes) -> bool:
    """True when `data` has checksum `expected` (an int or its bytes form)."""
    if isinstance(expected, (bytes, bytearray)):
        expected = int.from_bytes(expected, "little")
    return checksum(data) == expected


def _direct(pool: PoolView) -> bool:
    """Whether the C helper may reach `pool`'s slots by address: a pool whose
    `block` is PoolView's own (a subclass that overrides it - a test's gated or
    failing pool - is reached through it, slot by slot)."""
    return _native is not None and type(pool).block is PoolView.block


def checksum_slots(pool: PoolView, slots: Sequence[int]) -> list[int]:
    """The checksum of each slot's block in `pool`; what `pool.block` raises for
    a slot it cannot give (IndexError outside the pool). Blocks the calling
    thread for the hashing only: other threads run meanwhile (the C helper)."""
    if _direct(pool):
        assert _native is not None
        return _native.sum_slots(pool.address, pool.slot_bytes, pool.block_bytes,
                                 pool.num_slots, slots)
    block = pool.block
    return [checksum(block(slot)) for slot in slots]


def land_slots(pool: PoolView, slots: Sequence[int],
               buffers: Sequence[bytes | bytearray | memoryview]) -> list[int]:
    """Copy `buffers[i]` (one block's bytes each) into slot `slots[i]` of `pool`
    and return each block's checksum, taken from the slot right after its copy.
    A ValueError (a count or a buffer's size that does not match) before anything
    is copied; what `pool.block` raises for a slot it cannot give (IndexError
    outside the pool: the C helper checks every slot first, the Python path as it
    goes). The buffers must not overlap the slots."""
    if len(buffers) != len(slots):
        raise ValueError(f"{len(buffers)} buffers for {len(slots)} slots")
    if _direct(pool):
        assert _native is not None
        return _native.land_slots(pool.address, pool.slot_bytes, pool.block_bytes,
                                  pool.num_slots, slots, buffers)
    block, size = pool.block, pool.block_bytes
    for i, data in enumerate(buffers):
        if memoryview(data).nbytes != size:
            raise ValueError(f"buffer {i} holds {memoryview(data).nbytes} bytes, "
                             f"a block is {size}")
    sums = []
    for slot, data in zip(slots, buffers, strict=True):
        dst = block(slot)
        dst[:] = data
        sums.append(checksum(dst))
    return sums
