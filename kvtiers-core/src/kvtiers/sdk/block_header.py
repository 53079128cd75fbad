"""A self-describing header in front of a stored block: what makes a hit verifiable
on storage that others share (a key-value store, an object store).

A stored object is `header + block bytes`. The header says which key of which
namespace the block is, how long it is and its checksum, and carries a checksum of
its own, so that any object found at one of a tier's names is classified as ours,
another model's, another program's, or ours and damaged - whoever wrote it. Each
tier has its own 8-byte magic (`BlockHeaderFormat(magic)`); the layout is the same.
Little-endian::

    0    8  magic (the tier's)
    8    2  format version (1)
    10   2  header length: 70 + key length (where the block starts)
    12  32  namespace fingerprint (32 lowercase hex digits, `Namespace.fingerprint`)
    44   8  block length
    52   8  block checksum (`kvtiers.sdk.checksum`, xxh3-64)
    60   2  key length
    62   k  the key
    62+k 8  header checksum: `kvtiers.sdk.checksum` of bytes [0, 62 + k)

The header of a key has one length (`header_bytes`), so a tier may read exactly
`header_bytes(len(key)) + block_bytes` bytes. `judge` classifies any bytes, however
short or mangled, and never raises (`Bad`): FOREIGN (not this format: another
program's object, left alone), NAMESPACE (another model's block, left alone), BROKEN
(this format, for this key and model, but damaged or cut short: the tier removes
it), or None when the header is this key's. The block checksum is checked by the
caller, on the bytes that landed. Pure functions, any thread.

    FORMAT = BlockHeaderFormat(b"KVTMYTIR")
    value = FORMAT.encode(ns.fingerprint, key, block)           # header + block
    bad = FORMAT.judge(value, ns.fingerprint, key, block_bytes)  # None: this key's
    packer = FORMAT.packer(ns.fingerprint, block_bytes)          # headers, fast
    head = packer.pack(key, checksum(block))
"""

from __future__ import annotations

import enum
import struct
import threading

from kvtiers.sdk.integrity import checksum

__all__ = ["FIXED_BYTES", "VERSION", "Bad", "BlockHeaderFormat", "Header", "HeaderPacker",
           "header_bytes"]

VERSION = 1
_FIXED = struct.Struct("<8sHH32sQQH")
_TAIL = struct.Struct("<Q")
#: bytes of the header before the key
FIXED_BYTES = _FIXED.size  # 62
_SUM_AT = 52  # where the block checksum starts
_MAGIC_BYTES = 8


class Bad(str, enum.Enum):  # noqa: UP042 - StrEnum is 3.11+, we support 3.10
    """Why an object is not the block asked for."""

    FOREIGN = "foreign"  # not this format (another program's object): a miss, left alone
    NAMESPACE = "namespace"  # another model's block: a miss, left alone
    BROKEN = "broken"  # this format, key and model, but damaged or cut short: removed


class Header:
    """A parsed, intact header."""

    __slots__ = ("fingerprint", "key", "block_bytes", "block_sum", "length")

    def __init__(self, fingerprint: str, key: bytes, block_bytes: int, block_sum: int,
                 length: int):
        self.fingerprint = fingerprint
        self.key = key
        self.block_bytes = block_bytes
        self.block_sum = block_sum
        self.length = length  # of the header: where the block starts

    def __repr__(self) -> str:
        return (f"Header(fingerprint={self.fingerprint!r}, key={self.key.hex()}, "
                f"block_bytes={self.block_bytes}, length={self.length})")


def header_bytes(key_bytes: int) -> int:
    """The length of the header of a key of `key_bytes` bytes."""
    return FIXED_BYTES + key_bytes + _TAIL.size


class HeaderPacker:
    """Packs the headers of one namespace and block size fast: the bytes all of them
    share (all but the key, the block checksum and the header checksum) are packed
    once per key length. `pack(key, block_sum)` is the format's `pack`, byte for
    byte. A load may check a header by comparing it with the one packed for its key
    and the checksum of the block that landed, and `judge` whatever differs."""

    __slots__ = ("_magic", "_fingerprint", "_block_bytes", "_prefixes")

    def __init__(self, magic: bytes, fingerprint: str, block_bytes: int):
        self._magic = magic
        self._fingerprint = fingerprint.encode("ascii")
        self._block_bytes = block_bytes
        self._prefixes: dict[int, bytes] = {}  # key length -> bytes [0, 52)

    def _prefix(self, key_bytes: int) -> bytes:
        prefix = self._prefixes.get(key_bytes)
        if prefix is None:
            prefix = _FIXED.pack(self._magic, VERSION, header_bytes(key_bytes),
                                 self._fingerprint, self._block_bytes, 0, key_bytes)[:_SUM_AT]
            self._prefixes[key_bytes] = prefix  # (a race packs the same bytes twice)
        return prefix

    def pack(self, key: bytes, block_sum: int) -> bytes:
        """The header of `key`'s block, whose checksum is `block_sum`."""
        k = len(key)
        head = b"".join((self._prefix(k), block_sum.to_bytes(8, "little"),
                         k.to_bytes(2, "little"), key))
        return head + checksum(head).to_bytes(8, "little")


class BlockHeaderFormat:
    """The header format under one tier's 8-byte `magic` (see the module doc)."""

    __slots__ = ("magic", "_packers", "_lock")

    def __init__(self, magic: bytes):
        if len(magic) != _MAGIC_BYTES:
            raise ValueError(f"a block header magic is {_MAGIC_BYTES} bytes, got {magic!r}")
        self.magic = bytes(magic)
        self._packers: dict[tuple[str, int], HeaderPacker] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"BlockHeaderFormat({self.magic!r})"

    def pack(self, fingerprint: str, key: bytes, block_bytes: int, block_sum: int) -> bytes:
        """The header of `key`'s block of `block_bytes` with checksum `block_sum` in
        the namespace `fingerprint`."""
        head = _FIXED.pack(self.magic, VERSION, header_bytes(len(key)),
                           fingerprint.encode("ascii"), block_bytes, block_sum,
                           len(key)) + bytes(key)
        return head + _TAIL.pack(checksum(head))

    def encode(self, fingerprint: str, key: bytes,
               block: bytes | bytearray | memoryview) -> bytes:
        """The object for `key`: header and block (one copy of the block's bytes; the
        checksum is taken from the same bytes)."""
        view = memoryview(block).cast("B")
        return b"".join((self.pack(fingerprint, key, view.nbytes, checksum(view)), view))

    def packer(self, fingerprint: str, block_bytes: int) -> HeaderPacker:
        """The `HeaderPacker` of namespace `fingerprint` and block size `block_bytes`
        (one per pair, shared)."""
        packer = self._packers.get((fingerprint, block_bytes))
        if packer is None:
            with self._lock:
                packer = self._packers.setdefault(
                    (fingerprint, block_bytes),
                    HeaderPacker(self.magic, fingerprint, block_bytes))
        return packer

    def parse(self, data: bytes | bytearray | memoryview) -> Header | None:
        """The header at the start of `data` when it is this format and intact,
        else None. Never raises."""
        view = memoryview(data).cast("B")
        if view.nbytes < FIXED_BYTES or bytes(view[:_MAGIC_BYTES]) != self.magic:
            return None
        _, version, hlen, fp, blen, bsum, klen = _FIXED.unpack_from(view)
        if version != VERSION or hlen != header_bytes(klen) or view.nbytes < hlen:
            return None
        (stored,) = _TAIL.unpack_from(view, hlen - _TAIL.size)
        if checksum(view[: hlen - _TAIL.size]) != stored:
            return None
        key = bytes(view[FIXED_BYTES : FIXED_BYTES + klen])
        return Header(fp.decode("ascii", "replace"), key, blen, bsum, hlen)

    def judge(self, data: bytes | bytearray | memoryview, fingerprint: str, key: bytes,
              block_bytes: int, length: int | None = None) -> Bad | None:
        """None when `data` (an object, or its start) holds an intact header for `key`
        of `fingerprint`'s namespace, for a block of `block_bytes`, and the whole
        object is exactly header plus block; else why not (see the module doc).
        `length`: the whole object's length when `data` is only its start (default:
        `data`'s). Fewer bytes than the magic are FOREIGN (nothing says they are
        ours); a later format version is FOREIGN too (not ours to judge). Never raises."""
        view = memoryview(data).cast("B")
        n = view.nbytes
        if n < _MAGIC_BYTES or bytes(view[:_MAGIC_BYTES]) != self.magic:
            return Bad.FOREIGN
        if n >= 10 and int.from_bytes(view[8:10], "little") != VERSION:
            return Bad.FOREIGN
        header = self.parse(view)
        if header is None:  # checked before the namespace: a flipped byte is damage
            return Bad.BROKEN
        if header.fingerprint != fingerprint:
            return Bad.NAMESPACE
        whole = n if length is None else length
        if header.key != key or header.block_bytes != block_bytes or \
                whole != header.length + block_bytes:
            return Bad.BROKEN
        return None
