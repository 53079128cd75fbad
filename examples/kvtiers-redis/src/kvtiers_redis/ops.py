"""What `kvtiers inspect` and `kvtiers verify` ask of the `redis` tier.

- `survey_store(settings, name)`: every namespace under the prefix - ours and other
  models' - with its blocks, their bytes and, where its tier wrote one, the
  namespace's description (`<prefix>:<fingerprint>:m:namespace`: model, geometry).
  A synchronous client of its own; no tier is built and nothing is written.
- `inventory(...)`: what one tier's index holds, committed and reserved.
- `verify_piece(...)`: re-read and re-check some of a tier's blocks (a coroutine on
  the tier's loop; `RedisTier.verify_blocks` runs it piece by piece and reports
  progress from its caller's thread between pieces). Reasons from
  `kvtiers.contract.verification`: `missing`, `header`, `foreign`, `truncated`,
  `checksum`, `not_regular` (another type of value), `unreadable`. Repair takes a
  bad block out of the index (usage stays exact) and deletes its value when it is
  ours and damaged; another program's value or another model's block is left alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import redis
from kvtiers.errors import KvtiersError
from kvtiers.sdk import (
    BadBlock,
    BlockRecord,
    NamespaceInventory,
    TierContext,
    TierInventory,
    checksum,
)
from redis.exceptions import RedisError, ResponseError

from kvtiers_redis import record
from kvtiers_redis.names import Names, escape, split
from kvtiers_redis.settings import RedisSettings
from kvtiers_redis.transfers import EXPECTED, Transfers, wall_ms

__all__ = ["describe", "inventory", "survey_store", "verify_piece"]

PIECE = 512


def describe(ctx: TierContext) -> dict[str, Any]:
    """The namespace's description, written at start-up for `survey_store`."""
    ns = ctx.namespace
    return {"model": ns.model, "revision": ns.revision, "format_version": ns.format_version,
            "fingerprint": ns.fingerprint, "block_bytes": ctx.block_bytes,
            "geometry": [dataclasses.asdict(g) for g in ns.groups]}


def survey_store(settings: RedisSettings, name: str) -> TierInventory:
    client = redis.Redis.from_url(settings.url, socket_timeout=settings.timeout_s,
                                  socket_connect_timeout=settings.timeout_s,
                                  **settings.client_options())
    try:
        blocks: dict[str, list[tuple[bytes, bytes]]] = {}  # fingerprint -> (name, key)
        described: set[str] = set()
        for found in client.scan_iter(match=escape(settings.prefix.encode()) + b":*",
                                      count=1000):
            parts = split(settings.prefix, found)
            if parts is None:
                continue
            fp, kind, rest = parts
            key = Names(settings.prefix, fp).key_of(found) if kind == b"b" else None
            if key is not None:
                blocks.setdefault(fp, []).append((found, key))
            elif kind == b"m" and rest == b"namespace":
                described.add(fp)
        out = []
        for fp in sorted(set(blocks) | described):
            out.append(_namespace(client, settings, fp, blocks.get(fp, []), fp in described))
        return TierInventory(name, tuple(out))
    except RedisError as exc:
        raise KvtiersError(f"redis tier {name}: {settings.address} cannot be read "
                           f"({type(exc).__name__}: {settings.scrub(str(exc))})") from None
    finally:
        client.close()


def _namespace(client: redis.Redis, settings: RedisSettings, fp: str,
               names: list[tuple[bytes, bytes]], described: bool) -> NamespaceInventory:
    records = []
    for at in range(0, len(names), PIECE):
        pipe = client.pipeline(transaction=False)
        for found, _ in names[at:at + PIECE]:
            pipe.strlen(found)
        for (_, key), length in zip(names[at:at + PIECE], pipe.execute(raise_on_error=False),
                                    strict=True):
            if isinstance(length, int) and length > 0:
                size = length - record.header_bytes(len(key))
                records.append(BlockRecord(key, size if size > 0 else length))
    doc: dict[str, Any] = {}
    if described:
        raw = client.get(Names(settings.prefix, fp).namespace)
        try:
            loaded = json.loads(raw) if isinstance(raw, (bytes, str)) else {}
            doc = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            doc = {}
    geometry = doc.get("geometry")
    return NamespaceInventory(
        namespace=fp, location=f"{settings.address} {settings.prefix}:{fp}",
        blocks=tuple(records), committed_bytes=sum(r.size for r in records),
        capacity_bytes=settings.capacity_bytes,
        model=doc.get("model") if isinstance(doc.get("model"), str) else None,
        revision=doc.get("revision") if isinstance(doc.get("revision"), str) else None,
        geometry=tuple(g for g in geometry if isinstance(g, dict))
        if isinstance(geometry, list) else ())


def inventory(io: Transfers, name: str, location: str) -> TierInventory:
    ns = io.ctx.namespace
    index = io.index
    return TierInventory(name, (NamespaceInventory(
        namespace=ns.fingerprint, location=location,
        blocks=tuple(BlockRecord(k, size) for k, _, size in index.items()),
        committed_bytes=index.committed_bytes, reserved_bytes=index.reserved_bytes,
        reserved_blocks=index.reserved_bytes // io.block_bytes,
        capacity_bytes=index.capacity_bytes, model=ns.model, revision=ns.revision,
        geometry=tuple(dataclasses.asdict(g) for g in ns.groups)),))


def _diagnose(value: bytes, io: Transfers, key: bytes) -> tuple[str, str, bool] | None:
    """(reason, detail, ours) for a bad value, None for a good one."""
    bad = record.check_header(value, io.fingerprint, key, io.block_bytes)
    if bad is record.Bad.FOREIGN:
        return "header", "not a kvtiers-redis value (another program's)", False
    if bad is record.Bad.NAMESPACE:
        return "foreign", "another model's block", False
    header = record.parse_header(value)
    if header is None:
        return "header", "the header is damaged", True
    found, blen, expected, start = header.key, header.block_bytes, header.block_sum, \
        header.length
    if found != key:
        return "foreign", f"the value is for key {found.hex()}", True
    if blen != io.block_bytes or len(value) != start + blen:
        return "truncated", (f"{len(value) - start} block bytes, expected "
                             f"{io.block_bytes}"), True
    if checksum(memoryview(value)[start:]) != expected:
        return "checksum", "the block's bytes changed", True
    return None


async def verify_piece(io: Transfers, items: list[tuple[bytes, int, int]], *,
                       repair: bool) -> tuple[list[BadBlock], int, int]:
    """(bad blocks, vanished, bytes removed) for `items` (`BoundedIndex.items()`)."""
    bad: list[BadBlock] = []
    vanished = removed = 0
    names = [io.names.block(k) for k, _, _ in items]
    pipe = io.client.pipeline(transaction=False)
    for found in names:
        pipe.get(found)
    try:
        values = await asyncio.wait_for(pipe.execute(raise_on_error=False), io.timeout())
    except EXPECTED as exc:
        values = [exc] * len(items)
    doomed = []
    for (key, expires, size), found, value in zip(items, names, values, strict=True):
        if isinstance(value, ResponseError) and str(value).startswith("WRONGTYPE"):
            why: tuple[str, str, bool] | None = ("not_regular", "a value of another type", False)
        elif isinstance(value, Exception):
            bad.append(BadBlock(key, "unreadable", f"{type(value).__name__}: "
                                f"{io.settings.scrub(str(value))}", found.decode()))
            continue
        elif value is None:
            gone = io.index.get(key) != expires or (expires and expires <= wall_ms())
            if gone:  # evicted or expired meanwhile: not bad
                vanished += 1
                continue
            why = ("missing", "no value at the block's name", False)
        else:
            why = _diagnose(value, io, key)
        if why is None:
            continue
        reason, detail, ours = why
        taken = repair and io.index.remove(key, expires) is not None
        if taken:
            removed += size
            if ours:
                doomed.append(found)
        bad.append(BadBlock(key, reason, detail, found.decode(), removed=taken))
    if doomed:
        await io.unlink(doomed)
    return bad, vanished, removed
