"""`PartsBody`: a request body made of parts - a header, then a pool slot, ... -
read where they lie, never joined into one buffer.

A store used to copy a job's slots into one object-sized buffer and PUT that: for
a 16 MiB segment a fresh 16 MiB allocation (page faults, zeroing), a copy under
the GIL, all before the first byte is sent, on every request at once at the start
of a job (docs/tiers/s3.md, "Measurements"). With this body the HTTP client sends
each part from where it is: the kernel copies the slot into the socket, nothing
else does.

botocore takes a body with `read` (its parameter check), sizes it with `len`, and
on a retry rewinds it with `seek(0)`; urllib3 sends what each `read` returns with
one `sendall`. It asks for 16 KiB at a time: `read` returns a whole part (or what
is left of it) however little was asked for, because 128 sends of 16 KiB per 2 MiB
slot cost more than the copy they save (measured). Every consumer in botocore and
urllib3 takes a read of any length. A part is handed out as a memoryview: the
caller keeps the parts unchanged until the request is over (the slots are the
job's until it is reported), then `close`s the body.

Any thread; one request at a time.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

__all__ = ["Buffer", "PartsBody", "joined"]

Buffer = bytes | bytearray | memoryview


class PartsBody:
    """The bytes of `parts`, one after another, as a readable, seekable stream."""

    def __init__(self, parts: Sequence[Buffer]):
        self._parts = [memoryview(p).cast("B") for p in parts]
        self._starts = []
        pos = 0
        for part in self._parts:
            self._starts.append(pos)
            pos += part.nbytes
        self._size = pos
        self._part = 0  # the part the position is in (never an empty one)
        self._pos = 0  # the position, from the start of the body
        self.seek(0)

    def __len__(self) -> int:
        return self._size

    def close(self) -> None:
        """Let go of the parts: the slots are the job's again (a failed request's
        traceback may keep this body, never the slots). Reads give b"" after."""
        self._parts, self._starts, self._part = [], [], 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        pos = base + offset
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = min(pos, self._size)
        self._part = 0
        while self._part < len(self._parts) and \
                self._starts[self._part] + self._parts[self._part].nbytes <= self._pos:
            self._part += 1
        return self._pos

    def read(self, size: int | None = -1) -> bytes | memoryview:
        """The rest of the current part (at least 1 byte while any are left; b"" at
        the end); with `size` < 0 or None, everything left, joined."""
        if size is None or size < 0:
            out = b"".join(self._rest())
            self.seek(0, io.SEEK_END)
            return out
        if self._part >= len(self._parts) or size == 0:
            return b""
        part = self._parts[self._part]
        view = part[self._pos - self._starts[self._part]:]
        self._pos += view.nbytes
        self._part += 1
        while self._part < len(self._parts) and self._parts[self._part].nbytes == 0:
            self._part += 1
        return view

    def _rest(self) -> list[memoryview]:
        if self._part >= len(self._parts):
            return []
        rel = self._pos - self._starts[self._part]
        return [self._parts[self._part][rel:], *self._parts[self._part + 1:]]


def joined(parts: Sequence[Buffer]) -> bytearray:
    """The parts copied into one buffer of their total size (for a client that
    needs the body as bytes)."""
    out = bytearray(sum(memoryview(p).nbytes for p in parts))
    dst, pos = memoryview(out), 0
    for part in parts:
        n = memoryview(part).nbytes
        dst[pos:pos + n] = part
        pos += n
    return out
