"""The value of a block in Redis: a header naming what it is, then the block bytes.

Self-describing and verifiable on its own, so that a value is never served for
the wrong key, the wrong model or damaged - whoever wrote it. Little-endian::

    0   8   magic b"KVTREDIS"
    8   2   format version (1)
    10  2   header length: 70 + key length (where the block bytes start)
    12  32  namespace fingerprint (32 lowercase hex digits, `Namespace.fingerprint`)
    44  8   block length
    52  8   block checksum (`kvtiers.sdk.checksum`, xxh3-64)
    60  2   key length
    62  k   the key
    62+k 8  header checksum: `kvtiers.sdk.checksum` of bytes [0, 62 + k)

`check_header` classifies any bytes, however short or mangled, and never raises:
FOREIGN (not this format: another program's value, left alone), NAMESPACE
(another model's block, left alone), or BROKEN (this format, for this key and
model, but damaged or cut short: the tier deletes it), or None when the header
is this key's. The block checksum is checked last, by the caller, on the bytes in
the pool slot. Pure functions, any thread.
"""

from __future__ import annotations

import enum
import struct

from kvtiers.sdk import checksum

__all__ = ["MAGIC", "Bad", "check_header", "encode", "header_bytes", "parse_header"]

MAGIC = b"KVTREDIS"
VERSION = 1
_FIXED = struct.Struct("<8sHH32sQQH")
_TAIL = struct.Struct("<Q")
FIXED_BYTES = _FIXED.size  # 62


class Bad(str, enum.Enum):  # noqa: UP042 - StrEnum is 3.11+, we support 3.10
    """Why a value is not the block asked for."""

    FOREIGN = "foreign"  # not this format (another program's value): a miss, left alone
    NAMESPACE = "namespace"  # another model's block: a miss, left alone
    BROKEN = "broken"  # this format and model, but damaged or cut short: deleted


def header_bytes(key_bytes: int) -> int:
    return FIXED_BYTES + key_bytes + _TAIL.size


def encode(fingerprint: str, key: bytes, block: bytes | bytearray | memoryview) -> bytes:
    """The value for `key`: header and block (one copy of the block's bytes; the
    checksum is taken from the same bytes)."""
    view = memoryview(block).cast("B")
    head = _FIXED.pack(MAGIC, VERSION, header_bytes(len(key)), fingerprint.encode("ascii"),
                       view.nbytes, checksum(view), len(key)) + bytes(key)
    return b"".join((head, _TAIL.pack(checksum(head)), view))


def parse_header(value: bytes | memoryview) -> tuple[str, bytes, int, int, int] | None:
    """(fingerprint, key, block length, block checksum, header length) of a value in
    this format whose header is intact, else None."""
    view = memoryview(value).cast("B")
    if view.nbytes < FIXED_BYTES or bytes(view[:8]) != MAGIC:
        return None
    _, version, hlen, fp, blen, bsum, klen = _FIXED.unpack_from(view)
    if version != VERSION or hlen != header_bytes(klen) or view.nbytes < hlen:
        return None
    (stored,) = _TAIL.unpack_from(view, hlen - _TAIL.size)
    if checksum(view[: hlen - _TAIL.size]) != stored:
        return None
    key = bytes(view[FIXED_BYTES : FIXED_BYTES + klen])
    return fp.decode("ascii", "replace"), key, blen, bsum, hlen


def check_header(value: bytes | memoryview, fingerprint: str, key: bytes,
                 block_bytes: int, length: int | None = None) -> Bad | None:
    """None when `value` starts with an intact header for `key` of `fingerprint`'s
    namespace, of a block of `block_bytes`, and holds exactly that many block bytes
    after it (a value cut short, or with bytes past its end, is BROKEN). `length`:
    the whole value's length, when `value` is only its start (a start-up scan reads
    headers alone)."""
    view = memoryview(value).cast("B")
    n = view.nbytes
    if bytes(view[: min(8, n)]) != MAGIC[: min(8, n)]:
        return Bad.FOREIGN
    if n >= 10 and int.from_bytes(view[8:10], "little") != VERSION:
        return Bad.FOREIGN  # a later format: not ours to judge
    parsed = parse_header(view)
    if parsed is None:  # checked before the namespace: a flipped byte is damage
        return Bad.BROKEN
    found_fp, found, blen, _, hlen = parsed
    if found_fp != fingerprint:
        return Bad.NAMESPACE
    if found != key or blen != block_bytes or (n if length is None else length) != hlen + blen:
        return Bad.BROKEN
    return None
