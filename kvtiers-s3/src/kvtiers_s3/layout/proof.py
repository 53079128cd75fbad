"""Whether an object without the kvtiers-s3 magic is still provably kvtiers-s3's.

An object at a name the tier makes whose first bytes are not `KVTS3BLK` /
`KVTS3SEG` parses as `foreign`. That is what another program's object looks like,
and also what one of the tier's own objects looks like once its first byte is
damaged. The two are told apart by the checksum that covers the magic: a record's
header checksum, a segment's index checksum. With the magic put back, a damaged
object of ours checks out - its checksum, its namespace, its key - and another
program's does not (xxh3-64 matching by chance: 2^-64). An object proven ours is
ours and broken (the tier deletes it); one that is not is never deleted.

Pure functions, any thread.
"""

from __future__ import annotations

from kvtiers_s3.layout import codec, segment
from kvtiers_s3.layout.codec import FormatError

__all__ = ["mended", "record_is_ours", "segment_index_is_ours"]


def mended(buf: bytes | bytearray | memoryview, magic: bytes) -> bytes:
    """`buf` with its first `len(magic)` bytes replaced by `magic`."""
    view = memoryview(buf).cast("B")
    if view.nbytes < len(magic):
        return bytes(view)
    return magic + bytes(view[len(magic):])


def record_is_ours(head: bytes | bytearray | memoryview, fingerprint: str, key: bytes) -> bool:
    """Whether `head` - the first bytes of a block object (at least its header),
    which fail with `foreign` - is the record of `key` in namespace `fingerprint`
    whose magic alone is damaged."""
    try:
        header = codec.decode_header(mended(head, codec.MAGIC), fingerprint)
    except FormatError:
        return False
    return header.key == bytes(key)


def segment_index_is_ours(head: bytes | bytearray | memoryview, fingerprint: str) -> bool:
    """Whether `head` - the first bytes of a segment, the whole index at least (a
    TRUNCATED `FormatError` with `need` asks for more; nothing else is raised) - is
    a segment of namespace `fingerprint` whose magic alone is damaged."""
    try:
        segment.decode_index(mended(head, segment.SEGMENT_MAGIC), fingerprint)
    except FormatError as exc:
        if exc.need is not None and exc.need > memoryview(head).nbytes:
            raise
        return False
    return True
