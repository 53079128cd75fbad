"""Start-up: what one namespace holds in Redis, read back into the index.

`scan` walks `SCAN MATCH <prefix>:<fingerprint>:b:*` and, for each name in pieces
of `PIECE`, pipelines the header (`GETRANGE`), the length (`STRLEN`) and the time
to live (`PTTL`): a block whose header is this key's, of this namespace and block
size, and whose value is exactly header plus block, is adopted; a damaged one of
ours (this format, bad header, wrong key or length) is deleted; anything else at
our names (another program's value, another type) is left alone and not counted.
No block's bytes are read: their checksums are verified when they are loaded.

`order` puts the found blocks in the recency order the last close wrote
(`<prefix>:<fingerprint>:m:recency`), oldest first; blocks it does not name were
stored after that close (a process killed since) and come last, as the newest.

Runs on the tier's event loop; each request is bounded by `timeout_s`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from kvtiers_redis import record
from kvtiers_redis.names import Names

__all__ = ["Found", "order", "read_recency", "scan"]

PIECE = 512


@dataclass(slots=True)
class Found:
    blocks: list[tuple[bytes, int]] = field(default_factory=list)  # (key, expiry ms; 0: none)
    broken: list[bytes] = field(default_factory=list)  # names of damaged values of ours
    other: int = 0  # values at our names that are not ours: left alone


async def scan(client: aioredis.Redis, names: Names, block_bytes: int, timeout_s: float,
               now_ms: int) -> Found:
    found = Found()
    cursor: Any = 0
    piece: list[bytes] = []
    while True:
        cursor, batch = await asyncio.wait_for(
            client.scan(cursor, match=names.pattern(), count=1000), timeout_s)
        piece += [n if isinstance(n, bytes) else n.encode() for n in batch]
        while len(piece) >= PIECE or (piece and int(cursor) == 0):
            await _check(client, names, block_bytes, piece[:PIECE], found, timeout_s, now_ms)
            del piece[:PIECE]
        if int(cursor) == 0:
            return found


async def _check(client: aioredis.Redis, names: Names, block_bytes: int, piece: list[bytes],
                 found: Found, timeout_s: float, now_ms: int) -> None:
    keyed = [(name, key) for name in piece if (key := names.key_of(name)) is not None]
    found.other += len(piece) - len(keyed)
    pipe = client.pipeline(transaction=False)
    for name, key in keyed:
        pipe.getrange(name, 0, record.header_bytes(len(key)) - 1)
        pipe.strlen(name)
        pipe.pttl(name)
    replies = await asyncio.wait_for(pipe.execute(raise_on_error=False), timeout_s)
    for n, (name, key) in enumerate(keyed):
        head, length, ttl = replies[3 * n : 3 * n + 3]
        if isinstance(head, Exception) or isinstance(length, Exception) or not isinstance(
                ttl, int):
            found.other += 1  # another type of value (a list, a hash): not ours
            continue
        if ttl == -2:  # gone since the SCAN
            continue
        bad = record.check_header(head, names.fingerprint, key, block_bytes, length=length)
        if bad is None:
            found.blocks.append((key, now_ms + ttl if ttl >= 0 else 0))
        elif bad is record.Bad.BROKEN:
            found.broken.append(name)
        else:
            found.other += 1


async def read_recency(client: aioredis.Redis, names: Names, timeout_s: float) -> list[bytes]:
    """The keys the last close wrote down, oldest first; [] when there is no manifest
    or it cannot be read (it is a hint: the blocks are there either way)."""
    raw = await asyncio.wait_for(client.get(names.recency), timeout_s)
    if raw is None:
        return []
    try:
        doc = json.loads(raw)
        return [bytes.fromhex(item) for item in doc if isinstance(item, str)]
    except (ValueError, TypeError):
        return []


def order(blocks: Iterable[tuple[bytes, int]], recency: list[bytes]) -> list[tuple[bytes, int]]:
    """`blocks` oldest first: those `recency` names in its order, then the others."""
    rank = {key: n for n, key in enumerate(recency)}
    late = len(rank)
    return sorted(blocks, key=lambda b: rank.get(b[0], late))
