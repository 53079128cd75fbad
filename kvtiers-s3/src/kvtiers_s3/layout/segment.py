"""The packed segment: several block records in one object, an index in front.

Small blocks cost one request each in the per-block layout; an object store moves
bytes fastest in objects of several MiB. A segment holds the blocks of one store
job, up to `segment_bytes`; a load reads one record with a ranged GET. Layout,
little-endian::

    0   8   magic b"KVTS3SEG"
    8   2   format version (1)
    10  2   reserved (0)
    12  4   count: records in the segment
    16  32  namespace fingerprint (32 lowercase hex digits)
    48  8   index length: bytes from 0 to the first record (entries + checksum)
    56  8   object length: the whole segment, in bytes
    64  ..  count entries: key length (u16), key, record offset (u64), record
            length (u64), payload checksum (u64)
    ..  8   index checksum: xxh3-64 of everything before it
    ..      the records (`codec.py`: each with its own header), back to back, in
            index order, the first at the index length, the last ending at the
            object length

The index lets start-up find a segment's keys with one short GET (the first
`INDEX_PROBE_BYTES`, or exactly the index length if longer), without reading any
block. Each record carries its key, namespace and checksum again, so a ranged GET
is verified on its own, whatever the index said. Strict, total parsing as in
`codec.py`. Pure functions, any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash
from kvtiers.sdk import checksum

from kvtiers_s3.layout.codec import (
    MAX_KEY_BYTES,
    FormatError,
    Reason,
    RecordHeader,
    decode_record,
    encode_header,
    fingerprint_bytes,
    header_bytes,
)

__all__ = [
    "INDEX_PROBE_BYTES",
    "SEGMENT_MAGIC",
    "SegmentEntry",
    "SegmentIndex",
    "decode_index",
    "decode_member",
    "encode_segment",
    "segment_parts",
    "plan_segments",
    "segment_bytes",
]

SEGMENT_MAGIC = b"KVTS3SEG"
SEGMENT_VERSION = 1
MAX_RECORDS = 1 << 16
#: what start-up reads first of each segment: the whole index of ~1000 records
INDEX_PROBE_BYTES = 64 * 1024

_FIXED = struct.Struct("<8sHHI32sQQ")
_ENTRY = struct.Struct("<QQQ")  # after the key: offset, length, checksum
_KLEN = struct.Struct("<H")
_TAIL = struct.Struct("<Q")
FIXED_BYTES = _FIXED.size  # 64


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    """Where one record lies in its segment: a ranged GET of
    `[offset, offset + length)` returns exactly the record."""

    key: bytes
    offset: int
    length: int
    checksum: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class SegmentIndex:
    fingerprint: str
    entries: tuple[SegmentEntry, ...]
    index_bytes: int
    object_bytes: int


def index_bytes(keys: Sequence[bytes]) -> int:
    """Length of the index of a segment holding these keys."""
    return FIXED_BYTES + sum(_KLEN.size + len(k) + _ENTRY.size for k in keys) + _TAIL.size


def segment_bytes(keys: Sequence[bytes], payload_bytes: int) -> int:
    """Length of a segment holding one block of `payload_bytes` per key."""
    return index_bytes(keys) + sum(header_bytes(len(k)) + payload_bytes for k in keys)


def plan_segments(n: int, payload_bytes: int, key_bytes: int, limit: int) -> list[range]:
    """How a store job's `n` blocks (consecutive indices) split into segments of at
    most `limit` bytes: as few segments as fit, of near-equal counts (a 17-block job
    with room for 16 a segment is 9 + 8, not 16 + 1, so no segment is a runt that
    costs a request for one block). A block larger than `limit` gets one of its own."""
    if n <= 0:
        return []
    per_record = _KLEN.size + key_bytes + _ENTRY.size + header_bytes(key_bytes) + payload_bytes
    fit = max(1, (limit - FIXED_BYTES - _TAIL.size) // per_record)
    count = -(-n // fit)
    base, extra = divmod(n, count)
    out, start = [], 0
    for i in range(count):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def segment_parts(
    fingerprint: str,
    blocks: Sequence[tuple[bytes, bytes | bytearray | memoryview]],
) -> tuple[list[bytes | memoryview], SegmentIndex]:
    """One segment holding `blocks` ((key, payload) pairs, distinct keys) as its
    parts - the index, then each record's header and payload - and its index. The
    payloads are not copied (views of them): a request body sent straight from
    the slots (`client.body.PartsBody`). Checksums are taken from the payloads."""
    if not 0 < len(blocks) <= MAX_RECORDS:
        raise ValueError(f"a segment holds 1..{MAX_RECORDS} blocks, not {len(blocks)}")
    keys = [bytes(k) for k, _ in blocks]
    if len(set(keys)) != len(keys):
        raise ValueError("a segment cannot hold one key twice")
    fp = fingerprint_bytes(fingerprint)
    views = [memoryview(p).cast("B") for _, p in blocks]
    sums = [checksum(v) for v in views]
    start = index_bytes(keys)
    entries: list[SegmentEntry] = []
    offset = start
    for key, view, s in zip(keys, views, sums, strict=True):
        if not 0 < len(key) <= MAX_KEY_BYTES:
            raise ValueError(f"a key has 1..{MAX_KEY_BYTES} bytes, not {len(key)}")
        length = header_bytes(len(key)) + view.nbytes
        entries.append(SegmentEntry(key, offset, length, s))
        offset += length
    head = bytearray(_FIXED.pack(SEGMENT_MAGIC, SEGMENT_VERSION, 0, len(entries), fp, start,
                                 offset))
    for e in entries:
        head += _KLEN.pack(len(e.key))
        head += e.key
        head += _ENTRY.pack(e.offset, e.length, e.checksum)
    head += _TAIL.pack(xxhash.xxh3_64_intdigest(head))
    assert len(head) == start
    parts: list[bytes | memoryview] = [bytes(head)]
    for e, view in zip(entries, views, strict=True):
        parts += [encode_header(fingerprint, e.key, view.nbytes, e.checksum), view]
    return parts, SegmentIndex(fingerprint, tuple(entries), start, offset)


def encode_segment(
    fingerprint: str,
    blocks: Sequence[tuple[bytes, bytes | bytearray | memoryview]],
) -> tuple[bytearray, SegmentIndex]:
    """One segment holding `blocks` as one buffer, and its index (`segment_parts`,
    each payload copied once)."""
    parts, index = segment_parts(fingerprint, blocks)
    # One buffer of the final size, filled in place: appending 14 MiB to a growing
    # bytearray reallocates (copies) it several times.
    out = bytearray(index.object_bytes)
    dst, pos = memoryview(out), 0
    for part in parts:
        dst[pos:pos + len(part)] = part
        pos += len(part)
    assert pos == index.object_bytes
    return out, index


def decode_index(buf: bytes | bytearray | memoryview, fingerprint: str | None = None,
                 *, object_bytes: int | None = None) -> SegmentIndex:
    """The index at the start of `buf` (a prefix of the segment is enough: a
    TRUNCATED error's `need` says how long a prefix to read). `object_bytes`: the
    object's size as the store reports it, which must match the index."""
    view = memoryview(buf).cast("B")
    n = view.nbytes
    m = len(SEGMENT_MAGIC)
    if bytes(view[: min(n, m)]) != SEGMENT_MAGIC[: min(n, m)]:
        raise FormatError(Reason.FOREIGN, "not a kvtiers-s3 segment (no KVTS3SEG magic)")
    if n < FIXED_BYTES:
        raise FormatError(Reason.TRUNCATED, f"{n} bytes, a segment index has at least "
                                            f"{FIXED_BYTES}", need=FIXED_BYTES)
    _, version, reserved, count, fp_raw, ilen, total = _FIXED.unpack_from(view)
    if version != SEGMENT_VERSION or reserved != 0:
        raise FormatError(Reason.VERSION, f"segment format version {version}; this "
                                          f"kvtiers-s3 reads {SEGMENT_VERSION}")
    if not 0 < count <= MAX_RECORDS or ilen < FIXED_BYTES + _TAIL.size or ilen > total:
        raise FormatError(Reason.CORRUPT, f"index of {count} records in {ilen} of {total} bytes")
    # A bound on the index before reading it: no index is larger than this.
    if ilen > FIXED_BYTES + count * (_KLEN.size + MAX_KEY_BYTES + _ENTRY.size) + _TAIL.size:
        raise FormatError(Reason.CORRUPT, f"index length {ilen} too large for {count} records")
    if n < ilen:
        raise FormatError(Reason.TRUNCATED, f"{n} bytes, the index has {ilen}", need=ilen)
    body = ilen - _TAIL.size
    (stored,) = _TAIL.unpack_from(view, body)
    if xxhash.xxh3_64_intdigest(view[:body]) != stored:
        raise FormatError(Reason.CORRUPT, "segment index checksum mismatch")
    if not set(fp_raw) <= set(b"0123456789abcdef"):
        raise FormatError(Reason.CORRUPT, "the namespace fingerprint is not hex")
    found = fp_raw.decode("ascii")
    if fingerprint is not None and found != fingerprint:
        raise FormatError(Reason.NAMESPACE, f"namespace {found}, expected {fingerprint}")
    if object_bytes is not None and object_bytes != total:
        reason = Reason.TRUNCATED if object_bytes < total else Reason.LENGTH
        raise FormatError(reason, f"the object has {object_bytes} bytes, its index says {total}")
    entries = _entries(view, count, body, ilen, total)
    return SegmentIndex(found, entries, ilen, total)


def _entries(view: memoryview, count: int, body: int, ilen: int,
             total: int) -> tuple[SegmentEntry, ...]:
    entries: list[SegmentEntry] = []
    seen: set[bytes] = set()
    pos, expect = FIXED_BYTES, ilen
    for _ in range(count):
        if pos + _KLEN.size > body:
            raise FormatError(Reason.CORRUPT, "index entries run past the index")
        (klen,) = _KLEN.unpack_from(view, pos)
        pos += _KLEN.size
        if not 0 < klen <= MAX_KEY_BYTES or pos + klen + _ENTRY.size > body:
            raise FormatError(Reason.CORRUPT, f"index entry with key length {klen}")
        key = bytes(view[pos:pos + klen])
        pos += klen
        offset, length, s = _ENTRY.unpack_from(view, pos)
        pos += _ENTRY.size
        # Records are back to back in index order: each starts where the last ended.
        if offset != expect or length < header_bytes(klen) or offset + length > total:
            raise FormatError(Reason.CORRUPT, f"record at {offset}+{length} out of place")
        if key in seen:
            raise FormatError(Reason.CORRUPT, "a key appears twice in the index")
        seen.add(key)
        entries.append(SegmentEntry(key, offset, length, s))
        expect = offset + length
    if pos != body or expect != total:
        raise FormatError(Reason.CORRUPT, "the index does not account for every byte")
    return tuple(entries)


def decode_member(
    buf: bytes | bytearray | memoryview,
    entry: SegmentEntry,
    fingerprint: str | None = None,
    *,
    payload_bytes: int | None = None,
    verify: bool = True,
) -> tuple[RecordHeader, memoryview]:
    """One record read by a ranged GET of `entry`'s bytes: checked against the
    entry (key, length, checksum) and the namespace, as `codec.decode_record`."""
    header, payload = decode_record(buf, fingerprint, key=entry.key,
                                    payload_bytes=payload_bytes, verify=verify)
    if header.record_bytes != entry.length or header.checksum != entry.checksum:
        raise FormatError(Reason.CORRUPT, "the record does not match the segment index")
    return header, payload
