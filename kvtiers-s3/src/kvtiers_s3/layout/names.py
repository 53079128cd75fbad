"""Where objects live under the tier's prefix, and the only way names are parsed.

    <root>/<fingerprint>/                  one namespace (Namespace.fingerprint, 32 hex)
      NAMESPACE.json                       model, revision, geometry (for people and tools)
      b/<shard>/<key hex>                  one block per object (per-block layout)
      s/<shard>/<writer>-<sequence>        a packed segment (16 + 12 hex digits)

`<shard>` is two hex digits of a hash of the rest of the name: 256 sub-prefixes,
so that start-up lists them concurrently (one listing per shard instead of one long
paginated listing) and so that AWS S3 spreads the request rate over partitions. A
writer id is random per tier instance, a sequence counts its segments: segment names
never repeat, so an object is never overwritten in place.

Anything else under a namespace prefix is ignored - never loaded, never deleted.
Pure functions, any thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import xxhash

__all__ = [
    "BLOCKS",
    "NAMESPACE_FILE",
    "SEGMENTS",
    "ParsedName",
    "block_name",
    "namespace_root",
    "parse_name",
    "segment_name",
    "shard_prefixes",
]

BLOCKS = "b"
SEGMENTS = "s"
NAMESPACE_FILE = "NAMESPACE.json"
SHARDS = 256

_BLOCK = re.compile(r"^(?:[0-9a-f]{2})+$")
_SEGMENT = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{12})$")


@dataclass(frozen=True, slots=True)
class ParsedName:
    """What a listed name is: a block (`key` set) or a segment (`writer`, `seq`)."""

    kind: str  # BLOCKS or SEGMENTS
    key: bytes | None = None
    writer: int | None = None
    seq: int | None = None


def namespace_root(root: str, fingerprint: str) -> str:
    """The prefix of one namespace under the tier's root ("bucket/prefix")."""
    return f"{root}/{fingerprint}" if root else fingerprint


def shard_of(tail: str) -> str:
    return f"{xxhash.xxh3_64_intdigest(tail.encode()) % SHARDS:02x}"


def block_name(ns_root: str, key: bytes) -> str:
    tail = bytes(key).hex()
    return f"{ns_root}/{BLOCKS}/{shard_of(tail)}/{tail}"


def segment_name(ns_root: str, writer: int, seq: int) -> str:
    if not (0 <= writer < 1 << 64 and 0 <= seq < 1 << 48):
        raise ValueError(f"writer {writer} / sequence {seq} out of range")
    tail = f"{writer:016x}-{seq:012x}"
    return f"{ns_root}/{SEGMENTS}/{shard_of(tail)}/{tail}"


def shard_prefixes(ns_root: str, kind: str) -> list[str]:
    """The 256 sub-prefixes of one kind of object, for concurrent listings."""
    return [f"{ns_root}/{kind}/{i:02x}/" for i in range(SHARDS)]


def parse_name(ns_root: str, name: str) -> ParsedName | None:
    """What `name` (a full path as listed, with or without the protocol's leading
    slash) is, or None for anything this tier did not name - including a name in
    the wrong shard."""
    base = ns_root.strip("/") + "/"
    name = name.strip("/")
    if not name.startswith(base):
        return None
    parts = name[len(base):].split("/")
    if len(parts) != 3 or parts[1] != shard_of(parts[2]):
        return None
    kind, _, tail = parts
    if kind == BLOCKS and _BLOCK.match(tail):
        return ParsedName(BLOCKS, key=bytes.fromhex(tail))
    m = _SEGMENT.match(tail)
    if kind == SEGMENTS and m:
        return ParsedName(SEGMENTS, writer=int(m[1], 16), seq=int(m[2], 16))
    return None
