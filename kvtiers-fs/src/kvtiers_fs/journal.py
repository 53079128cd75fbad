"""The on-disk form of a namespace's index: an append-only journal of fixed-size
records, grouped in checksummed frames, plus periodic snapshots.

Record (64 bytes, little-endian): op (u8), ident length (u8), 6 zero bytes, writer
id (u64), size (u64: file bytes, or a generation for ROTATE/RELOAD), ident (40 bytes,
zero padded). Frame: magic "KVJ1", record count (u32), xxh3-64 of the records (u64),
then the records. One frame is one `pwrite` by one writer holding the namespace lock:
a frame is the unit that is either wholly in the journal or not at all; a torn
frame can only be the last one, left by a writer killed while appending, and the
next lock holder cuts it off.

Snapshot `snapshot.<gen>`: magic "KVS1", layout version, generation, record count,
committed blocks, committed bytes, xxh3-64 of the records; then records: ENTRY
(committed blocks, in the eviction policy's export order, oldest first), ADD
(intents still pending, with their writer) and LASTDEL (each writer's last batch of
removals). It is the state at the start of `journal.<gen>`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash

from kvtiers_fs.layout import MAX_INLINE_IDENT, Ident

# Ops. ADD/COMMIT/ABORT: a writer's intent to write a block, then its outcome.
ADD = ord("+")
COMMIT = ord("=")
ABORT = ord("x")
REMOVE = ord("-")  # evicted or found corrupt: the writer unlinks the file right after
FORGET = ord("f")  # dropped from the index, the file is left alone (not ours to delete)
TOUCH = ord("t")  # recency
GONE = ord("g")  # writer `writer` died and was reconciled
ROTATE = ord("r")  # continue in journal.<size>; the state carries over
RELOAD = ord("l")  # state replaced: reload snapshot.<size> (after a rebuild)
# Snapshot only.
ENTRY = ord("e")
LASTDEL = ord("d")

RECORD = struct.Struct("<BB6xQQ40s")
FRAME = struct.Struct("<4sIQ")
FRAME_MAGIC = b"KVJ1"
SNAP = struct.Struct("<4sIQQQQQ")
SNAP_MAGIC = b"KVS1"
SNAP_VERSION = 1

assert RECORD.size == 64 and MAX_INLINE_IDENT <= 40 < 256


@dataclass(frozen=True, slots=True)
class Record:
    op: int
    writer: int
    size: int
    ident: Ident

    def pack(self) -> bytes:
        return RECORD.pack(self.op, len(self.ident), self.writer, self.size, self.ident)


def frame(records: list[Record]) -> bytes:
    body = b"".join([r.pack() for r in records])
    return FRAME.pack(FRAME_MAGIC, len(records), xxhash.xxh3_64_intdigest(body)) + body


def _records(body: bytes | memoryview) -> list[Record]:
    return [Record(op, writer, size, raw[:n])
            for op, n, writer, size, raw in RECORD.iter_unpack(body)]


def raw_records(body: bytes | memoryview) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(op, ident length, writer, size, padded ident) per record, without building
    `Record`s: what loading a million-entry snapshot can afford."""
    return RECORD.iter_unpack(body)


class JournalCorrupt(Exception):
    """A damaged frame with intact data after it: not a torn tail, the journal
    cannot be trusted (power loss without `durable`, or disk damage)."""


@dataclass(slots=True)
class Tail:
    """What `read_frames` found: frames as (writer of its first record, records),
    the offset after the last complete frame, and whether bytes follow that
    offset which do not form a complete frame (a torn tail, or a frame still being
    written by a live writer)."""

    frames: list[list[Record]]
    offset: int
    torn: bool


def read_frames(fd: int, offset: int) -> Tail:
    """Complete frames from `offset` to the end of the journal open at `fd`."""
    end = os.fstat(fd).st_size
    if offset >= end:
        return Tail([], offset, False)
    view = memoryview(os.pread(fd, end - offset, offset))
    frames: list[list[Record]] = []
    pos = 0
    while len(view) - pos >= FRAME.size:
        magic, count, digest = FRAME.unpack_from(view, pos)
        if magic != FRAME_MAGIC:
            return _bad(frames, offset + pos, offset + len(view))
        size = FRAME.size + count * RECORD.size
        if len(view) - pos < size:
            break
        body = view[pos + FRAME.size : pos + size]
        if xxhash.xxh3_64_intdigest(body) != digest:
            return _bad(frames, offset + pos, offset + len(view), after=offset + pos + size)
        frames.append(list(_records(body)))
        pos += size
    return Tail(frames, offset + pos, pos < len(view))


def _bad(frames: list[list[Record]], at: int, end: int, after: int | None = None) -> Tail:
    # Damage at the very end is a torn append; damage with a whole frame's worth of
    # bytes after it means something in the middle went bad.
    if after is not None and after < end:
        raise JournalCorrupt(f"damaged journal frame at offset {at}")
    return Tail(frames, at, True)


# -- snapshots ------------------------------------------------------------------


@dataclass(slots=True)
class Snapshot:
    gen: int
    body: memoryview  # records; iterate with `raw_records`
    blocks: int
    bytes: int


def pack_snapshot(gen: int, records: list[Record], blocks: int, nbytes: int) -> bytes:
    body = b"".join([r.pack() for r in records])
    head = SNAP.pack(SNAP_MAGIC, SNAP_VERSION, gen, len(records), blocks, nbytes,
                     xxhash.xxh3_64_intdigest(body))
    return head + body


def read_snapshot_head(data: bytes) -> tuple[int, int, int, int, int]:
    """(gen, records, blocks, bytes, checksum) of a snapshot; ValueError if bad."""
    if len(data) < SNAP.size:
        raise ValueError("snapshot truncated")
    magic, version, gen, count, blocks, nbytes, digest = SNAP.unpack_from(data)
    if magic != SNAP_MAGIC or version != SNAP_VERSION:
        raise ValueError("not a kvtiers-fs snapshot of this version")
    return gen, count, blocks, nbytes, digest


def parse_snapshot(data: bytes) -> Snapshot:
    gen, count, blocks, nbytes, digest = read_snapshot_head(data)
    body = memoryview(data)[SNAP.size :]
    if len(body) != count * RECORD.size or xxhash.xxh3_64_intdigest(body) != digest:
        raise ValueError("snapshot damaged")
    return Snapshot(gen, body, blocks, nbytes)


def snapshot_name(gen: int) -> str:
    return f"snapshot.{gen}"


def journal_name(gen: int) -> str:
    return f"journal.{gen}"


def generation_of(name: str, prefix: str) -> int | None:
    if not name.startswith(prefix + "."):
        return None
    tail = name[len(prefix) + 1 :]
    return int(tail) if tail.isdigit() else None
