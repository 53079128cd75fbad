"""What is stored under one namespace prefix, found by listing it: start-up, and the
probes that find what other engines stored.

`scan` lists both kinds of objects (the shards concurrently past one page), turns
each block name of a record's size into a `StoredObject` at once (its header is
checked when it is loaded) and reads each segment's index - and the header of a
block object of another size - with one short ranged GET, concurrently.
An object at a name the tier makes is judged by what it holds:

- *ours and broken* (`Scan.bad`: the tier deletes it): a block object whose size
  is not a record's, or a segment whose index is wrong, where the header or index
  says it is ours - by its magic, or, the magic damaged, by its checksum with the
  magic put back (`layout.proof`);
- *not ours to read* (`Scan.others`): such an object without the kvtiers-s3 magic
  that no checksum proves ours, or one of another format version or namespace. The tier
  never deletes it, but counts its bytes against `capacity_bytes` (quarantined:
  `holdings.index`) and does not read it again until it changes
  (`holdings.verdicts`).

Names the tier did not make are not even looked at.

The recency manifest (`recency.json` under the namespace prefix) is the index's
`export()`, written at close by whichever engine closes last; advisory (start-up
orders entries by store time, then applies it).

Coroutines on the tier's loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvtiers.sdk import Namespace

from kvtiers_s3.client.objects import ObjectInfo, ObjectStore
from kvtiers_s3.holdings.index import Member, StoredObject, segment_oid
from kvtiers_s3.layout import codec, proof, segment
from kvtiers_s3.layout.codec import FormatError, Reason
from kvtiers_s3.layout.names import BLOCKS, NAMESPACE_FILE, SEGMENTS, parse_name, shard_prefixes

__all__ = ["BROKEN", "RECENCY_FILE", "Scan", "block_object", "judge_block", "read_recency",
           "read_segment", "scan", "write_namespace", "write_recency"]

RECENCY_FILE = "recency.json"
INDEX_READS = 32  # segment indexes read at once
#: format problems that make an object ours and broken (deleted), not someone else's
BROKEN = frozenset({Reason.TRUNCATED, Reason.CORRUPT, Reason.KEY, Reason.LENGTH})


@dataclass
class Scan:
    objects: list[StoredObject] = field(default_factory=list)  # oldest first
    bad: list[str] = field(default_factory=list)  # ours and broken: delete
    #: not ours to read (no magic and no proof, another version's or namespace's):
    #: left where they are, counted, not read again until they change
    others: list[tuple[ObjectInfo, Reason]] = field(default_factory=list)
    listed: set[str] = field(default_factory=set)  # every name listed
    seconds: float = 0.0


def block_object(info: ObjectInfo, key: bytes, block_bytes: int) -> StoredObject | None:
    """A listed block object, or None when its size says it is not a whole record."""
    size = codec.header_bytes(len(key)) + block_bytes
    if info.size != size:
        return None
    return StoredObject(key, info.name, size, {key: Member(0, size)},
                        info.mtime if info.mtime is not None else time.time(), etag=info.etag)


async def judge_block(store: ObjectStore, info: ObjectInfo, key: bytes,
                      fingerprint: str) -> Reason:
    """Why the object at block `key`'s name, whose size is not a record's, is not
    the block, from its header (one short GET): a reason in `BROKEN` when it is ours
    - a kvtiers-s3 record by its magic, or by its header checksum where the magic is
    damaged (`layout.proof`) - else `foreign`, `namespace` or `version`."""
    if info.size < len(codec.MAGIC):  # too short to tell whose it is
        return Reason.FOREIGN
    head = await store.get(info.name, 0, min(info.size, codec.header_bytes(len(key))))
    try:
        header = codec.decode_header(head, fingerprint)
    except FormatError as exc:
        if exc.reason is Reason.FOREIGN and proof.record_is_ours(head, fingerprint, key):
            return Reason.CORRUPT
        return exc.reason
    return Reason.KEY if header.key != key else Reason.LENGTH


async def read_segment(store: ObjectStore, info: ObjectInfo, fingerprint: str,
                       block_bytes: int) -> StoredObject:
    """The segment's index as a `StoredObject` (raises FormatError; a segment whose
    magic alone is damaged is `corrupt`: `layout.proof`)."""
    head = await store.get(info.name, 0, min(info.size, segment.INDEX_PROBE_BYTES))
    try:
        head, index = await _index(store, info, head, fingerprint)
    except FormatError as exc:
        if exc.reason is Reason.FOREIGN and await _proven(store, info, head, fingerprint):
            raise FormatError(Reason.CORRUPT, "the segment's magic is damaged (its index "
                                              "checksum proves it ours)") from None
        raise
    members = {}
    for e in index.entries:
        if e.length != codec.header_bytes(len(e.key)) + block_bytes:
            raise FormatError(Reason.LENGTH, f"a record of {e.length} bytes in a segment of "
                                             f"{block_bytes}-byte blocks")
        members[e.key] = Member(e.offset, e.length, e.checksum)
    return StoredObject(segment_oid(info.name), info.name, info.size, members,
                        info.mtime if info.mtime is not None else time.time(), packed=True,
                        etag=info.etag, extra={"index_bytes": index.index_bytes})


async def _index(store: ObjectStore, info: ObjectInfo, head: bytes,
                 fingerprint: str) -> tuple[bytes, segment.SegmentIndex]:
    """The index from `head`, read further once if the index is longer."""
    try:
        return head, segment.decode_index(head, fingerprint, object_bytes=info.size)
    except FormatError as exc:
        need = exc.need
        if exc.reason is not Reason.TRUNCATED or need is None or need > info.size \
                or need <= len(head):
            raise
    head = await store.get(info.name, 0, need)
    return head, segment.decode_index(head, fingerprint, object_bytes=info.size)


async def _proven(store: ObjectStore, info: ObjectInfo, head: bytes, fingerprint: str) -> bool:
    """Whether the segment `head` begins, without its magic, is provably ours."""
    for _ in range(2):
        try:
            return proof.segment_index_is_ours(head, fingerprint)
        except FormatError as exc:
            if exc.need is None or exc.need > info.size:
                return False
            head = await store.get(info.name, 0, exc.need)
    return False


async def scan(store: ObjectStore, ns_root: str, fingerprint: str, block_bytes: int,
               *, known: Callable[[ObjectInfo], bool] | None = None,
               kinds: tuple[str, ...] = (BLOCKS, SEGMENTS)) -> Scan:
    """Every object of the namespace but those `known(info)` says are held (or
    judged already), oldest first; `Scan.listed` has every name listed (those too)."""
    start = time.perf_counter()
    out = Scan()
    listings = await asyncio.gather(*(
        store.list_objects(f"{ns_root}/{kind}/", shard_prefixes(ns_root, kind))
        for kind in kinds))
    to_read: list[tuple[ObjectInfo, bytes | None]] = []  # segments; blocks of a wrong size
    for info in (i for listing in listings for i in listing):
        out.listed.add(info.name)
        if known is not None and known(info):
            continue
        parsed = parse_name(ns_root, info.name)
        if parsed is None:
            continue
        if parsed.kind == BLOCKS and parsed.key is not None:
            obj = block_object(info, parsed.key, block_bytes)
            if obj is None:
                to_read.append((info, parsed.key))
            else:
                out.objects.append(obj)
        elif parsed.kind == SEGMENTS:
            to_read.append((info, None))
    sem = asyncio.Semaphore(INDEX_READS)

    async def one(info: ObjectInfo, key: bytes | None) -> StoredObject | Reason | None:
        async with sem:
            try:
                if key is None and info.size < len(segment.SEGMENT_MAGIC):
                    return Reason.FOREIGN  # too short to tell whose it is
                if key is not None:
                    return await judge_block(store, info, key, fingerprint)
                return await read_segment(store, info, fingerprint, block_bytes)
            except FormatError as exc:
                return exc.reason
            except FileNotFoundError:  # deleted since the listing
                return None

    for (info, _), got in zip(to_read, await asyncio.gather(*(one(*i) for i in to_read)),
                              strict=True):
        if isinstance(got, StoredObject):
            out.objects.append(got)
        elif got in BROKEN:
            out.bad.append(info.name)
        elif got is not None:
            out.others.append((info, got))
    out.objects.sort(key=lambda o: o.mtime)
    out.seconds = time.perf_counter() - start
    return out


def namespace_document(namespace: Namespace) -> bytes:
    return json.dumps({
        "model": namespace.model,
        "revision": namespace.revision,
        "format_version": namespace.format_version,
        "fingerprint": namespace.fingerprint,
        "groups": [{"layers": g.layers, "kv_heads": g.kv_heads, "head_size": g.head_size,
                    "dtype": g.dtype, "tokens_per_block": g.tokens_per_block,
                    "tp_size": g.tp_size} for g in namespace.groups],
        "written_by": "kvtiers-s3",
    }, indent=1).encode()


async def write_namespace(store: ObjectStore, ns_root: str, namespace: Namespace) -> None:
    """NAMESPACE.json, unless it is there (for people and tools; never read back)."""
    name = f"{ns_root}/{NAMESPACE_FILE}"
    if await store.size(name) is None:
        await store.put(name, namespace_document(namespace))


async def read_recency(store: ObjectStore, ns_root: str) -> list[str]:
    """The recency manifest's order (hex object ids, oldest first), [] if none or
    unreadable."""
    try:
        data = await store.get(f"{ns_root}/{RECENCY_FILE}")
        doc: Any = json.loads(data)
    except (FileNotFoundError, ValueError):
        return []
    order = doc.get("order") if isinstance(doc, dict) else None
    if not isinstance(order, list):
        return []
    return [x for x in order if isinstance(x, str)]


async def write_recency(store: ObjectStore, ns_root: str, order: list[str]) -> None:
    doc = {"format": 1, "written": time.time(), "order": order}
    await store.put(f"{ns_root}/{RECENCY_FILE}", json.dumps(doc).encode())
