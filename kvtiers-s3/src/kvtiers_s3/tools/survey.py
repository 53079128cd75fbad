"""`survey_store(settings, name)`: every namespace under the s3 tier's prefix - ours
and other models' - read without building the tier (`kvtiers inspect`, and the
namespaces `kvtiers verify` and `snapshot save` open); `held(...)`: what one built
tier holds (`S3Tier.inventory`).

The survey is read-only and takes nothing an engine waits for: one listing of the
prefix, each namespace's `NAMESPACE.json` (model, revision, geometry) and each
segment's index (one short ranged GET, as the tier's start-up reads them) - no
write, no delete. It classifies objects as the tier does (`holdings.catalog`): a
block object whose size is a block record's is a block (its header and bytes are
read by `kvtiers verify`, not here), a segment whose index reads is its blocks.
Everything else under a namespace's prefix but `NAMESPACE.json` and the recency
manifest is *unreadable* - a damaged object of ours, another format's or
namespace's object at our name, an object under a name the tier never makes -
counted with its bytes, since it takes room under the prefix. Store times come
from the listing, so ages cost nothing more.

Blocks on I/O (its own event loop, on a thread of its own); any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtiers.sdk import BlockGeometry, BlockRecord, NamespaceInventory, TierContext, TierInventory

from kvtiers_s3.client.connect import open_filesystem
from kvtiers_s3.client.objects import ObjectInfo, ObjectStore
from kvtiers_s3.holdings.catalog import (
    INDEX_READS,
    RECENCY_FILE,
    block_object,
    read_segment,
)
from kvtiers_s3.holdings.index import Holdings, StoredObject
from kvtiers_s3.layout.codec import FormatError
from kvtiers_s3.layout.names import BLOCKS, NAMESPACE_FILE, namespace_root, parse_name
from kvtiers_s3.settings import S3Settings

__all__ = ["METADATA", "held", "namespace_of_name", "survey_store", "unknown_names"]

#: objects under a namespace prefix that describe it and hold no block
METADATA = frozenset({NAMESPACE_FILE, RECENCY_FILE})
_HEX = frozenset("0123456789abcdef")


def namespace_of_name(root: str, name: str) -> tuple[str, str] | None:
    """(fingerprint, the rest of the name) of an object listed under the tier's
    `root`, or None outside any namespace prefix (not 32 lowercase hex digits)."""
    base = root.strip("/")
    name = name.strip("/")
    if base:
        if not name.startswith(base + "/"):
            return None
        name = name[len(base) + 1:]
    fp, sep, rest = name.partition("/")
    if not sep or len(fp) != 32 or not set(fp) <= _HEX:
        return None
    return fp, rest


def unknown_names(ns_root: str, infos: Iterable[ObjectInfo]) -> list[ObjectInfo]:
    """The objects of a namespace's listing at names the tier never makes (not a
    block, a segment or the namespace's metadata): never read, counted or deleted
    by the tier."""
    base = ns_root.strip("/") + "/"
    return [i for i in infos if parse_name(ns_root, i.name) is None
            and i.name.strip("/").removeprefix(base) not in METADATA]


def describe(doc: Any) -> tuple[str | None, str | None, tuple[Mapping[str, Any], ...],
                                int | None]:
    """(model, revision, geometry per group, block bytes) from a NAMESPACE.json
    document; block bytes None when the geometry does not give them."""
    if not isinstance(doc, dict):
        return None, None, (), None
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    revision = doc.get("revision") if isinstance(doc.get("revision"), str) else None
    groups = doc.get("groups")
    geometry = tuple(dict(g) for g in groups if isinstance(g, dict)) \
        if isinstance(groups, list) else ()
    try:
        block_bytes: int | None = max(BlockGeometry(**g).block_bytes for g in geometry)
    except (TypeError, ValueError):  # no groups, or fields of another version
        block_bytes = None
    return model, revision, geometry, block_bytes


@dataclass
class _Found:
    """One namespace's objects, as listed."""

    objects: list[ObjectInfo] = field(default_factory=list)
    described: ObjectInfo | None = None  # its NAMESPACE.json


def survey_store(settings: S3Settings, name: str, *, ages: bool = False) -> TierInventory:
    """See the module doc. Raises what the store raises (an OSError for a missing
    bucket or prefix that cannot be listed, botocore's errors for an unreachable
    server): the caller words it."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtiers-s3-survey") as t:
        return t.submit(asyncio.run, _survey(settings, name)).result()


async def _survey(settings: S3Settings, name: str) -> TierInventory:
    store = ObjectStore(open_filesystem(settings, loop=asyncio.get_running_loop()), settings)
    try:
        found: dict[str, _Found] = {}
        for info in await store.list_objects(settings.root.rstrip("/") + "/"):
            where = namespace_of_name(settings.root, info.name)
            if where is None:
                continue  # outside any namespace: no model's, counted by none
            ns = found.setdefault(where[0], _Found())
            if where[1] == NAMESPACE_FILE:
                ns.described = info
            ns.objects.append(info)
        out = [await _namespace(store, settings, fp, found[fp]) for fp in sorted(found)]
        return TierInventory(name, tuple(out))
    finally:
        await store.close()


async def _namespace(store: ObjectStore, settings: S3Settings, fp: str,
                     found: _Found) -> NamespaceInventory:
    ns_root = namespace_root(settings.root, fp)
    doc: Any = None
    error = None
    if found.described is not None:
        try:
            doc = json.loads(await store.get(found.described.name))
        except (FileNotFoundError, ValueError, RecursionError):
            doc = None
    model, revision, geometry, block_bytes = describe(doc)
    if block_bytes is None:
        error = (f"no readable {NAMESPACE_FILE}: its objects are counted by size, their "
                 "blocks not read")
    blocks: dict[bytes, BlockRecord] = {}  # the newest copy of each key
    committed = unreadable = unreadable_bytes = 0
    segments: list[ObjectInfo] = []

    def add(records: Iterable[BlockRecord]) -> None:
        for r in records:
            held = blocks.get(r.key)
            if held is None or (r.stored_at or 0.0) >= (held.stored_at or 0.0):
                blocks[r.key] = r

    for info in found.objects:
        parsed = parse_name(ns_root, info.name)
        if parsed is None:
            if info.name.strip("/").removeprefix(ns_root.strip("/") + "/") not in METADATA:
                unreadable += 1
                unreadable_bytes += info.size
        elif parsed.kind == BLOCKS and parsed.key is not None:
            if block_bytes is None:
                committed += info.size
                add([BlockRecord(parsed.key, info.size, info.mtime)])
            elif block_object(info, parsed.key, block_bytes) is None:
                unreadable += 1  # not a block record's size: ours and broken
                unreadable_bytes += info.size
            else:
                committed += info.size
                add([BlockRecord(parsed.key, info.size, info.mtime)])
        elif block_bytes is None:
            committed += info.size
        else:
            segments.append(info)
    for info, got in zip(segments, await _read_indexes(store, segments, fp, block_bytes or 0),
                         strict=True):
        if isinstance(got, StoredObject):
            committed += info.size
            add(BlockRecord(key, m.length, info.mtime) for key, m in got.members.items())
        elif got is not None:  # an index that does not read as ours
            unreadable += 1
            unreadable_bytes += info.size
    return NamespaceInventory(
        namespace=fp, location=f"{settings.protocol}://{ns_root}", blocks=tuple(blocks.values()),
        committed_bytes=committed, capacity_bytes=settings.capacity_bytes, model=model,
        revision=revision, geometry=geometry, error=error, unreadable_objects=unreadable,
        unreadable_bytes=unreadable_bytes)


async def _read_indexes(store: ObjectStore, segments: Sequence[ObjectInfo], fp: str,
                        block_bytes: int) -> list[StoredObject | FormatError | None]:
    """Each segment's index (None: deleted since the listing), `INDEX_READS` at once."""
    sem = asyncio.Semaphore(INDEX_READS)

    async def one(info: ObjectInfo) -> StoredObject | FormatError | None:
        async with sem:
            try:
                return await read_segment(store, info, fp, block_bytes)
            except FormatError as exc:
                return exc
            except FileNotFoundError:
                return None

    return list(await asyncio.gather(*(one(i) for i in segments)))


def held(holdings: Holdings, ctx: TierContext, settings: S3Settings, name: str,
         ns_root: str) -> TierInventory:
    """What one built tier holds: its blocks in its index's eviction order (the
    next victim's first; a segment's blocks in their order in it), each with the
    store time of its object; committed bytes as the index counts them, and the
    objects held that hold no block (a block object a load found not to be ours,
    kept counted until evicted) as unreadable. Any thread but the scheduler's;
    O(objects), no I/O."""
    records: list[BlockRecord] = []
    empty = empty_bytes = 0
    for _, obj, size in holdings.index.items():
        live = [(m.offset, key, m.length) for key, m in obj.members.items()
                if holdings.lookup(key) is obj]
        if not obj.members:
            empty += 1
            empty_bytes += size
        records += [BlockRecord(key, length, obj.mtime) for _, key, length in sorted(live)]
    ns = ctx.namespace
    return TierInventory(name, (NamespaceInventory(
        namespace=ns.fingerprint, location=f"{settings.protocol}://{ns_root}",
        blocks=tuple(records), committed_bytes=holdings.index.committed_bytes - empty_bytes,
        reserved_bytes=holdings.index.reserved_bytes, capacity_bytes=settings.capacity_bytes,
        model=ns.model, revision=ns.revision,
        geometry=tuple(dataclasses.asdict(g) for g in ns.groups),
        unreadable_objects=empty, unreadable_bytes=empty_bytes, eviction_order=True),))
