"""The header in front of every block object: what makes a hit verifiable.

An object is `header + block bytes`. The header says which key of which
namespace the block is, how long it is and its checksum, and carries a checksum
of its own, so that any object found at one of our names is classified as ours,
another model's, another program's, or ours and damaged - whoever wrote it.
Little-endian::

    0    8  magic b"KVTMOONC"
    8    2  format version (1)
    10   2  header length: 70 + key length (where the block starts)
    12  32  namespace fingerprint (32 lowercase hex digits)
    44   8  block length
    52   8  block checksum (`kvtiers.sdk.checksum`, xxh3-64)
    60   2  key length
    62   k  the key
    62+k 8  header checksum: `kvtiers.sdk.checksum` of bytes [0, 62 + k)

The header of a key has one length, so a load asks Mooncake for exactly
`header_bytes(len(key)) + block_bytes` bytes: the header into a small registered
area, the block straight into its pool slot. Pure functions, any thread.
"""

from __future__ import annotations

import enum
import struct

from kvtiers.sdk import checksum

__all__ = ["AREA_BYTES", "MAGIC", "MAX_KEY_BYTES", "Bad", "Expected", "Header", "header_bytes",
           "judge", "pack_header", "parse_header"]

MAGIC = b"KVTMOONC"
VERSION = 1
_FIXED = struct.Struct("<8sHH32sQQH")
_TAIL = struct.Struct("<Q")
FIXED_BYTES = _FIXED.size  # 62
_SUM_AT = 52  # where the block checksum starts
#: bytes of header area per pool slot (registered with Mooncake once)
AREA_BYTES = 256
#: the longest key whose header fits the area
MAX_KEY_BYTES = AREA_BYTES - FIXED_BYTES - _TAIL.size


class Bad(str, enum.Enum):  # noqa: UP042 - StrEnum is 3.11+, we support 3.10
    """Why an object is not the block asked for."""

    FOREIGN = "foreign"  # not this format: another program's object, left alone
    NAMESPACE = "namespace"  # another model's block: left alone
    BROKEN = "broken"  # this format, this key and model, damaged or cut short: removed


class Header:
    """A parsed, intact header."""

    __slots__ = ("fingerprint", "key", "block_bytes", "block_sum", "length")

    def __init__(self, fingerprint: str, key: bytes, block_bytes: int, block_sum: int,
                 length: int):
        self.fingerprint = fingerprint
        self.key = key
        self.block_bytes = block_bytes
        self.block_sum = block_sum
        self.length = length


def header_bytes(key_bytes: int) -> int:
    return FIXED_BYTES + key_bytes + _TAIL.size


def pack_header(fingerprint: str, key: bytes, block_bytes: int, block_sum: int) -> bytes:
    head = _FIXED.pack(MAGIC, VERSION, header_bytes(len(key)), fingerprint.encode("ascii"),
                       block_bytes, block_sum, len(key)) + bytes(key)
    return head + _TAIL.pack(checksum(head))


def parse_header(data: bytes | memoryview) -> Header | None:
    """The header at the start of `data` when it is this format and intact, else None."""
    view = memoryview(data).cast("B")
    if view.nbytes < FIXED_BYTES or bytes(view[:8]) != MAGIC:
        return None
    _, version, hlen, fp, blen, bsum, klen = _FIXED.unpack_from(view)
    if version != VERSION or hlen != header_bytes(klen) or view.nbytes < hlen:
        return None
    (stored,) = _TAIL.unpack_from(view, hlen - _TAIL.size)
    if checksum(view[: hlen - _TAIL.size]) != stored:
        return None
    key = bytes(view[FIXED_BYTES: FIXED_BYTES + klen])
    return Header(fp.decode("ascii", "replace"), key, blen, bsum, hlen)


class Expected:
    """The header bytes every block of one namespace and block size shares (all
    but the key, the block checksum and the header checksum, per key length), for
    packing headers fast. A load checks a header by comparing it with the one
    packed for its key and the checksum of the block that landed; anything that
    differs goes to `judge`."""

    __slots__ = ("_fingerprint", "_block_bytes", "_prefixes")

    def __init__(self, fingerprint: str, block_bytes: int):
        self._fingerprint = fingerprint.encode("ascii")
        self._block_bytes = block_bytes
        self._prefixes: dict[int, bytes] = {}  # key length -> bytes [0, 52)

    def _prefix(self, key_bytes: int) -> bytes:
        prefix = self._prefixes.get(key_bytes)
        if prefix is None:
            prefix = _FIXED.pack(MAGIC, VERSION, header_bytes(key_bytes), self._fingerprint,
                                 self._block_bytes, 0, key_bytes)[:_SUM_AT]
            self._prefixes[key_bytes] = prefix
        return prefix

    def pack(self, key: bytes, block_sum: int) -> bytes:
        """`pack_header(fingerprint, key, block_bytes, block_sum)`, faster."""
        k = len(key)
        head = b"".join((self._prefix(k), block_sum.to_bytes(8, "little"),
                         k.to_bytes(2, "little"), key))
        return head + checksum(head).to_bytes(8, "little")


def judge(data: bytes | memoryview, fingerprint: str, key: bytes, block_bytes: int,
          length: int) -> Bad | None:
    """None when `data` (an object's start) holds an intact header for `key` of
    `fingerprint`'s namespace, for a block of `block_bytes`, and the whole object
    (`length` bytes) is exactly header plus block. Never raises."""
    view = memoryview(data).cast("B")
    n = view.nbytes
    if bytes(view[: min(8, n)]) != MAGIC[: min(8, n)] or n < 8:
        return Bad.FOREIGN
    if n >= 10 and int.from_bytes(view[8:10], "little") != VERSION:
        return Bad.FOREIGN  # a later format: not ours to judge
    header = parse_header(view)
    if header is None:  # checked before the namespace: a flipped byte is damage
        return Bad.BROKEN
    if header.fingerprint != fingerprint:
        return Bad.NAMESPACE
    if header.key != key or header.block_bytes != block_bytes or \
            length != header.length + block_bytes:
        return Bad.BROKEN
    return None
