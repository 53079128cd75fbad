"""The on-disk form of a namespace's index: an append-only journal of fixed-size
records, grouped in checksummed frames, plus periodic snapshots.

Record (64 bytes, little-endian): op (u8), ident length (u8), 6 zero bytes, writer
id (u64), size (u64: file bytes, or a generation for ROTATE/RELOAD, or a writer id
for GONE), ident (40 bytes, zero padded). `writer` is the writer whose intent the
record is about: for ADD/COMMIT/ABORT the intent's owner (a settler ending a dead
writer's intents writes the dead writer's id), so a COMMIT or ABORT never ends
another writer's intent. Frame: magic "KVJ1", record count (u32), xxh3-64 of the
records (u64), then the records. One frame is one `pwrite` by one writer holding the
namespace lock: a frame is the unit that is either wholly in the journal or not at
all; a torn frame can only be the last one, left by a writer killed while appending,
and the next lock holder cuts it off.

Snapshot `snapshot.<gen>` (version 2): magic "KVS1", version (u32), generation,
record count, committed blocks, committed bytes, xxh3-64 of the records, base
generation, base offset (u64 each); then records: ENTRY (committed blocks, least
recently used first), ADD (intents still pending, with their writer) and LASTDEL
(each writer's last batch of removals). It is the state after the frames of
`journal.<base gen>` up to `base offset`: a rotation writes `snapshot.<g+1>` of the
state at some offset of `journal.<g>` (without holding the namespace lock), so a
reader of it replays `journal.<g>` from there to its ROTATE, then `journal.<g+1>`;
a rebuild's snapshot is based on the start of its own journal (`base gen` = gen,
offset 0).

Names: `snapshot.<gen>` and `journal.<gen>` with `gen` in canonical decimal
(no sign, no leading zero, ASCII digits only, below 2**62); any other name is not
one of ours (`generation_of`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import xxhash

from kvtiers_fs.disk.layout import MAX_INLINE_IDENT, Ident
from kvtiers_fs.pacing import CHUNK, digest_paced, pause

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
SNAP = struct.Struct("<4sIQQQQQQQ")
SNAP_MAGIC = b"KVS1"
SNAP_VERSION = 2
#: generations are below this (a name with a larger number is not ours)
MAX_GENERATION = 1 << 62
#: a journal read takes about this many bytes of frames at a time (256 records)
READ_CHUNK_BYTES = 16 << 10

assert RECORD.size == 64 and MAX_INLINE_IDENT <= 40 < 256


class Record(NamedTuple):
    """One journal record (a NamedTuple: built in about half the time of a frozen
    dataclass, a journal tail has hundreds of thousands)."""

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
    """The records of a frame body (a large frame is decoded in pieces, pausing in
    between: see pacing.py)."""
    if len(body) <= CHUNK * RECORD.size:
        return [Record(op, writer, size, raw[:n])
                for op, n, writer, size, raw in RECORD.iter_unpack(body)]
    out: list[Record] = []
    for at in range(0, len(body), CHUNK * RECORD.size):
        out += [Record(op, writer, size, raw[:n]) for op, n, writer, size, raw
                in RECORD.iter_unpack(body[at : at + CHUNK * RECORD.size])]
        pause()
    return out


def raw_records(body: bytes | memoryview) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(op, ident length, writer, size, padded ident) per record, without building
    `Record`s: what loading a million-entry snapshot can afford."""
    return RECORD.iter_unpack(body)


class JournalCorrupt(Exception):
    """A damaged frame with intact data after it: not a torn tail, the journal
    cannot be trusted (power loss without `durable`, or disk damage)."""


@dataclass(slots=True)
class Tail:
    """What `read_frames` found: frames (each a list of records), the offset after
    the last complete frame, and whether bytes follow that offset at the end of the
    file which do not form a complete frame (a torn tail, or a frame still being
    written by a live writer)."""

    frames: list[list[Record]]
    offset: int
    torn: bool


def read_frames(fd: int, offset: int, max_bytes: int | None = None) -> Tail:
    """Complete frames from `offset` to the end of the journal open at `fd`, or - with
    `max_bytes` - about that many bytes of them (at least one whole frame): callers
    that apply a long tail read it in pieces and pause in between. `torn` is only
    set at the real end of the file."""
    end = os.fstat(fd).st_size
    if offset >= end:
        return Tail([], offset, False)
    want = end - offset if max_bytes is None else min(end - offset, max_bytes)
    view = memoryview(os.pread(fd, want, offset))
    if len(view) >= FRAME.size and len(view) < end - offset:
        magic, count, _ = FRAME.unpack_from(view)
        first = FRAME.size + count * RECORD.size
        if magic == FRAME_MAGIC and first > len(view):  # one frame larger than asked
            view = memoryview(os.pread(fd, min(first, end - offset), offset))
    frames: list[list[Record]] = []
    pos = 0
    while len(view) - pos >= FRAME.size:
        magic, count, digest = FRAME.unpack_from(view, pos)
        if magic != FRAME_MAGIC:
            return _bad(frames, offset + pos, end)
        size = FRAME.size + count * RECORD.size
        if len(view) - pos < size:
            break
        body = view[pos + FRAME.size : pos + size]
        if xxhash.xxh3_64_intdigest(body) != digest:
            return _bad(frames, offset + pos, end, after=offset + pos + size)
        frames.append(_records(body))
        pos += size
    return Tail(frames, offset + pos, pos < len(view) and offset + len(view) == end)


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
    base_gen: int  # the state is that after journal.<base_gen> up to base_offset
    base_offset: int


@dataclass(frozen=True, slots=True)
class SnapshotHead:
    gen: int
    count: int
    blocks: int
    bytes: int
    digest: int
    base_gen: int
    base_offset: int


def pack_snapshot_head(gen: int, count: int, blocks: int, nbytes: int, digest: int,
                       base_gen: int, base_offset: int) -> bytes:
    return SNAP.pack(SNAP_MAGIC, SNAP_VERSION, gen, count, blocks, nbytes, digest,
                     base_gen, base_offset)


def pack_snapshot(gen: int, records: list[Record], blocks: int, nbytes: int,
                  base_gen: int | None = None, base_offset: int = 0) -> bytes:
    """A whole snapshot in memory (small ones: rebuilds, tests)."""
    body = b"".join([r.pack() for r in records])
    head = pack_snapshot_head(gen, len(records), blocks, nbytes,
                              xxhash.xxh3_64_intdigest(body),
                              gen if base_gen is None else base_gen, base_offset)
    return head + body


def read_snapshot_head(data: bytes | memoryview) -> SnapshotHead:
    """The head of a snapshot; ValueError if it is not one of this version, or
    names an impossible base."""
    if len(data) < SNAP.size:
        raise ValueError("snapshot truncated")
    magic, version, gen, count, blocks, nbytes, digest, bgen, boff = SNAP.unpack_from(data)
    if magic != SNAP_MAGIC or version != SNAP_VERSION:
        raise ValueError("not a kvtiers-fs snapshot of this version")
    if not 0 < gen < MAX_GENERATION or bgen not in (gen - 1, gen) or (bgen == gen and boff):
        raise ValueError("snapshot names an impossible generation or base")
    return SnapshotHead(gen, count, blocks, nbytes, digest, bgen, boff)


def parse_snapshot(data: bytes) -> Snapshot:
    """Check and decode a whole snapshot (ValueError if damaged). The checksum of a
    large body is computed in pieces, with pauses (see `pacing`)."""
    head = read_snapshot_head(data)
    body = memoryview(data)[SNAP.size :]
    if len(body) != head.count * RECORD.size or digest_paced(body) != head.digest:
        raise ValueError("snapshot damaged")
    return Snapshot(head.gen, body, head.blocks, head.bytes, head.base_gen, head.base_offset)


def snapshot_name(gen: int) -> str:
    return f"snapshot.{gen}"


def journal_name(gen: int) -> str:
    return f"journal.{gen}"


def generation_of(name: str, prefix: str) -> int | None:
    """The generation `name` (e.g. "snapshot.12") stands for, or None when it is not
    exactly `<prefix>.<canonical decimal below MAX_GENERATION>`: "snapshot.²",
    "snapshot.012", "snapshot.-1" or a 30-digit number are not ours."""
    if not name.startswith(prefix + "."):
        return None
    tail = name[len(prefix) + 1 :]
    if not (0 < len(tail) <= 19 and tail.isascii() and tail.isdigit()) or tail[0] == "0":
        return None
    gen = int(tail)
    return gen if gen < MAX_GENERATION else None
