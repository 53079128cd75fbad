"""What is stored under one namespace prefix, found by listing it: start-up, and the
probes that find what other engines stored.

`scan` lists both kinds of objects (the shards concurrently past one page), turns
each block name into a `StoredObject` at once (its header is checked when it is
loaded) and reads each segment's index with one short ranged GET, concurrently.
An object whose size or index is wrong is *ours and broken* (`bad`: the tier
deletes it), and so is a segment without the kvtiers-s3 magic: its name is one
only kvtiers-s3 makes, under the namespace's fingerprint, and nothing it cannot
parse may stay there uncounted (it would take room beyond `capacity_bytes` for
good). One of another format version or namespace is left alone (`foreign`,
`others`: the tier remembers them, `holdings.verdicts`, and does not read them
again until they change). Names the tier did not make are not even looked at.

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
from kvtiers_s3.layout import codec, segment
from kvtiers_s3.layout.codec import FormatError, Reason
from kvtiers_s3.layout.names import BLOCKS, NAMESPACE_FILE, SEGMENTS, parse_name, shard_prefixes

__all__ = ["RECENCY_FILE", "Scan", "read_recency", "scan", "write_namespace", "write_recency"]

RECENCY_FILE = "recency.json"
INDEX_READS = 32  # segment indexes read at once
#: format problems that make an object ours and broken (deleted), not someone else's
BROKEN = frozenset({Reason.TRUNCATED, Reason.CORRUPT, Reason.KEY, Reason.LENGTH})
#: ... and what makes a listed segment ours and broken: its name is ours
BROKEN_SEGMENT = BROKEN | {Reason.FOREIGN}


@dataclass
class Scan:
    objects: list[StoredObject] = field(default_factory=list)  # oldest first
    bad: list[str] = field(default_factory=list)  # ours and broken: delete
    foreign: int = 0  # another version's or namespace's, left alone
    others: list[tuple[ObjectInfo, Reason]] = field(default_factory=list)  # those, and why
    listed: set[str] = field(default_factory=set)  # every name listed
    seconds: float = 0.0


def block_object(info: ObjectInfo, key: bytes, block_bytes: int) -> StoredObject | None:
    """A listed block object, or None when its size says it is not a whole record."""
    size = codec.header_bytes(len(key)) + block_bytes
    if info.size != size:
        return None
    return StoredObject(key, info.name, size, {key: Member(0, size)},
                        info.mtime if info.mtime is not None else time.time(), etag=info.etag)


async def read_segment(store: ObjectStore, info: ObjectInfo, fingerprint: str,
                       block_bytes: int) -> StoredObject:
    """The segment's index as a `StoredObject` (raises FormatError)."""
    head = await store.get(info.name, 0, min(info.size, segment.INDEX_PROBE_BYTES))
    try:
        index = segment.decode_index(head, fingerprint, object_bytes=info.size)
    except FormatError as exc:
        if exc.reason is not Reason.TRUNCATED or exc.need is None or exc.need > info.size \
                or exc.need <= len(head):
            raise
        head = await store.get(info.name, 0, exc.need)
        index = segment.decode_index(head, fingerprint, object_bytes=info.size)
    members = {}
    for e in index.entries:
        if e.length != codec.header_bytes(len(e.key)) + block_bytes:
            raise FormatError(Reason.LENGTH, f"a record of {e.length} bytes in a segment of "
                                             f"{block_bytes}-byte blocks")
        members[e.key] = Member(e.offset, e.length, e.checksum)
    return StoredObject(segment_oid(info.name), info.name, info.size, members,
                        info.mtime if info.mtime is not None else time.time(), packed=True,
                        extra={"index_bytes": index.index_bytes})


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
    segments: list[ObjectInfo] = []
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
                out.bad.append(info.name)
            else:
                out.objects.append(obj)
        elif parsed.kind == SEGMENTS:
            segments.append(info)
    sem = asyncio.Semaphore(INDEX_READS)

    async def one(info: ObjectInfo) -> StoredObject | Reason | None:
        async with sem:
            try:
                return await read_segment(store, info, fingerprint, block_bytes)
            except FormatError as exc:
                return exc.reason
            except FileNotFoundError:  # deleted since the listing
                return None

    for info, got in zip(segments, await asyncio.gather(*(one(i) for i in segments)),
                         strict=True):
        if isinstance(got, StoredObject):
            if info.etag is not None:
                got.etag = info.etag
            out.objects.append(got)
        elif got in BROKEN_SEGMENT:
            out.bad.append(info.name)
        elif got is not None:
            out.foreign += 1
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
