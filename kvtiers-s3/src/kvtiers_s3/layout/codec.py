"""The block record: one block as stored, self-describing and verifiable on its own.

A record is a header followed by the block bytes (the payload). An object of the
per-block layout is exactly one record; a packed segment (`segment.py`) is an
index followed by records, and a ranged GET of one record gets something this
module verifies the same way. Header, little-endian::

    0   8   magic b"KVTS3BLK"
    8   2   format version (1)
    10  2   header length: 74 + key length (where the payload starts)
    12  4   flags (0; anything else is a format this version does not read)
    16  32  namespace fingerprint (32 lowercase hex digits, `Namespace.fingerprint`)
    48  8   payload length
    56  8   payload checksum (xxh3-64, `kvtiers.sdk.integrity`)
    64  2   key length
    66  k   the key
    66+k 8  header checksum: xxh3-64 of bytes [0, 66 + k)

Parsing is strict and total: any input, however short, long or mangled, gives a
record or a `FormatError` with a `Reason` - never another exception. Checks run
cheapest first; the payload checksum (the only one that reads the whole block)
runs last, and only when asked (the tier verifies the bytes once they are in the
pool slot instead). Pure functions, any thread.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import xxhash
from kvtiers.sdk import checksum

__all__ = [
    "MAGIC",
    "RECORD_VERSION",
    "FormatError",
    "Reason",
    "RecordHeader",
    "decode_header",
    "decode_record",
    "encode_header",
    "encode_record",
    "fingerprint_bytes",
    "record_parts",
    "header_bytes",
]

MAGIC = b"KVTS3BLK"
RECORD_VERSION = 1
MAX_KEY_BYTES = 256
FINGERPRINT_CHARS = 32

_FIXED = struct.Struct("<8sHHI32sQQH")
_TAIL = struct.Struct("<Q")
FIXED_BYTES = _FIXED.size  # 66
_HEX = frozenset(b"0123456789abcdef")


class Reason(str, enum.Enum):  # noqa: UP042 - StrEnum is 3.11+, we support 3.10
    """Why bytes are not the block asked for."""

    TRUNCATED = "truncated"  # fewer bytes than the format says there are
    FOREIGN = "foreign"  # not written by kvtiers-s3 (another magic)
    VERSION = "version"  # a format version or feature this code does not read
    NAMESPACE = "namespace"  # another model's (or geometry's) block
    KEY = "key"  # another key's block
    LENGTH = "length"  # another block size, or bytes past the end
    CORRUPT = "corrupt"  # a checksum does not match, or fields contradict


class FormatError(ValueError):
    """Bytes that are not a valid record (or segment). `need`: for TRUNCATED, how
    many bytes from the start would let parsing go on, if known."""

    def __init__(self, reason: Reason, detail: str, need: int | None = None):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.need = need


@dataclass(frozen=True, slots=True)
class RecordHeader:
    key: bytes
    fingerprint: str
    payload_bytes: int
    checksum: int
    header_bytes: int

    @property
    def record_bytes(self) -> int:
        return self.header_bytes + self.payload_bytes


def header_bytes(key_bytes: int) -> int:
    """Length of the header of a record whose key has `key_bytes` bytes."""
    return FIXED_BYTES + key_bytes + _TAIL.size


def fingerprint_bytes(fingerprint: str) -> bytes:
    raw = fingerprint.encode("ascii", "replace")
    if len(raw) != FINGERPRINT_CHARS or not set(raw) <= _HEX:
        raise ValueError(f"a namespace fingerprint is 32 lowercase hex digits, not {fingerprint!r}")
    return raw


def encode_header(fingerprint: str, key: bytes, payload_bytes: int, payload_checksum: int) -> bytes:
    """The header of a record (see the module docstring)."""
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"a key has 1..{MAX_KEY_BYTES} bytes, not {len(key)}")
    fixed = _FIXED.pack(MAGIC, RECORD_VERSION, header_bytes(len(key)), 0,
                        fingerprint_bytes(fingerprint), payload_bytes, payload_checksum, len(key))
    head = fixed + bytes(key)
    return head + _TAIL.pack(xxhash.xxh3_64_intdigest(head))


def encode_record(fingerprint: str, key: bytes, payload: bytes | bytearray | memoryview,
                  out: bytearray | None = None) -> bytearray:
    """Header and payload as one buffer (one copy of the payload), appended to `out`
    if given. The checksum is computed from `payload` as it is now."""
    view = memoryview(payload).cast("B")
    buf = bytearray() if out is None else out
    buf += encode_header(fingerprint, key, view.nbytes, checksum(view))
    buf += view
    return buf


def record_parts(fingerprint: str, key: bytes,
                 payload: bytes | bytearray | memoryview) -> list[bytes | memoryview]:
    """The record as its two parts, header and payload, the payload not copied (a
    view of `payload`): for a request body sent straight from the slot
    (`client.body.PartsBody`). The checksum is computed from `payload` as it is now."""
    view = memoryview(payload).cast("B")
    return [encode_header(fingerprint, key, view.nbytes, checksum(view)), view]


def decode_header(
    buf: bytes | bytearray | memoryview, fingerprint: str | None = None
) -> RecordHeader:
    """The header at the start of `buf` (which may hold just the header, or more).
    With `fingerprint`, a header of another namespace is a NAMESPACE error."""
    view = memoryview(buf).cast("B")
    n = view.nbytes
    if bytes(view[: min(n, len(MAGIC))]) != MAGIC[: min(n, len(MAGIC))]:
        raise FormatError(Reason.FOREIGN, "not a kvtiers-s3 block (no KVTS3BLK magic)")
    if n < FIXED_BYTES:
        raise FormatError(Reason.TRUNCATED, f"{n} bytes, a header has at least {FIXED_BYTES}",
                          need=FIXED_BYTES)
    (_, version, hlen, flags, fp_raw, plen, psum, klen) = _FIXED.unpack_from(view)
    if version != RECORD_VERSION:
        raise FormatError(Reason.VERSION,
                          f"format version {version}; this kvtiers-s3 reads {RECORD_VERSION}")
    if hlen != header_bytes(klen) or not 0 < klen <= MAX_KEY_BYTES:
        raise FormatError(Reason.CORRUPT, f"header length {hlen} does not fit key length {klen}")
    if n < hlen:
        raise FormatError(Reason.TRUNCATED, f"{n} bytes, the header has {hlen}", need=hlen)
    body_end = hlen - _TAIL.size
    (stored,) = _TAIL.unpack_from(view, body_end)
    if xxhash.xxh3_64_intdigest(view[:body_end]) != stored:
        raise FormatError(Reason.CORRUPT, "header checksum mismatch")
    if flags != 0:
        raise FormatError(Reason.VERSION, f"flags {flags:#x} name features this version lacks")
    if not set(fp_raw) <= _HEX:
        raise FormatError(Reason.CORRUPT, "the namespace fingerprint is not hex")
    found = fp_raw.decode("ascii")
    if fingerprint is not None and found != fingerprint:
        raise FormatError(Reason.NAMESPACE, f"namespace {found}, expected {fingerprint}")
    key = bytes(view[FIXED_BYTES:FIXED_BYTES + klen])
    return RecordHeader(key, found, plen, psum, hlen)


def decode_record(
    buf: bytes | bytearray | memoryview,
    fingerprint: str | None = None,
    *,
    key: bytes | None = None,
    payload_bytes: int | None = None,
    verify: bool = True,
) -> tuple[RecordHeader, memoryview]:
    """The header and the payload (a view into `buf`) of the record that is exactly
    `buf`. `key` / `payload_bytes` / `fingerprint`: what the record must be for;
    `verify`: check the payload checksum too (else the caller must, with
    `kvtiers.sdk.integrity.verify(data, header.checksum)`)."""
    view = memoryview(buf).cast("B")
    header = decode_header(view, fingerprint)
    if key is not None and header.key != key:
        raise FormatError(Reason.KEY, f"the record is for key {header.key.hex()}, "
                                      f"expected {bytes(key).hex()}")
    if payload_bytes is not None and header.payload_bytes != payload_bytes:
        raise FormatError(Reason.LENGTH, f"the block has {header.payload_bytes} bytes, "
                                         f"expected {payload_bytes}")
    end = header.record_bytes
    if view.nbytes < end:
        raise FormatError(Reason.TRUNCATED, f"{view.nbytes} bytes, the record has {end}",
                          need=end)
    if view.nbytes > end:
        raise FormatError(Reason.LENGTH, f"{view.nbytes - end} bytes past the record's end")
    payload = view[header.header_bytes:end]
    if verify and checksum(payload) != header.checksum:
        raise FormatError(Reason.CORRUPT, "block checksum mismatch")
    return header, payload
