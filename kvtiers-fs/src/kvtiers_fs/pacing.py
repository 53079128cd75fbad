"""Work that grows with the number of blocks, done in pieces.

The scheduler thread shares the interpreter with the tier's threads. A thread that
runs Python code (or one long C call) for a million blocks keeps the GIL for up to
the interpreter's switch interval (5 ms) at a time, however little it locks -
the scheduler's lookups then wait that long. So every loop here whose length is the
number of blocks (loading a snapshot, applying a journal tail, writing a snapshot,
copying the index for an inventory) runs in pieces of `CHUNK` items and calls
`pause()` between them, which releases the GIL so that a waiting thread takes it
at once (measured: bench/fs_lookup_latency.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TypeVar

import xxhash

T = TypeVar("T")

#: items per piece: about 50-250 µs of Python work each (1-3 µs per journal
#: record applied or packed, on the development VM's slowest days)
CHUNK = 256
#: bytes hashed per piece (xxh3 runs at several GB/s: ~100 µs)
DIGEST_CHUNK = 1 << 20


def pause() -> None:
    """Release the GIL and let any thread waiting for it run (a zero sleep: a
    syscall with the GIL released)."""
    time.sleep(0)


def chunks(items: Iterable[T], n: int = CHUNK) -> Iterator[list[T]]:
    """`items` in lists of `n`, pausing between them. The caller must keep the
    underlying collection unchanged meanwhile (it holds the lock that guards it)."""
    it = iter(items)
    while True:
        piece = list(islice(it, n))
        if not piece:
            return
        yield piece
        pause()


def digest_paced(data: bytes | memoryview) -> int:
    """xxh3-64 of `data`, hashed in pieces with pauses between them."""
    view = memoryview(data)
    if len(view) <= DIGEST_CHUNK:
        return xxhash.xxh3_64_intdigest(view)
    h = xxhash.xxh3_64()
    for at in range(0, len(view), DIGEST_CHUNK):
        h.update(view[at : at + DIGEST_CHUNK])
        pause()
    return h.intdigest()
