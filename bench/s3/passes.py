"""One pass of a raw client or a layout: new objects stored, then loaded, every
loaded byte compared with what was stored (untimed). Each returns, per operation
("store", "load", "load-ranged", "load-coalesced"), the pass's seconds and every
request's seconds."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kvtiers_s3.jobs.ranges import coalesce
from kvtiers_s3.layout import codec, segment

from bench.s3.clients import CpuClock, S3fsAsync, Timed

__all__ = ["FP", "blocks", "per_block_pass", "raw_pass", "segment_pass"]

FP = "0123456789abcdef0123456789abcdef"


def blocks(n: int, size: int) -> list[tuple[bytes, bytes]]:
    return [(os.urandom(36), os.urandom(size)) for _ in range(n)]


def raw_pass(client: Any, make: Callable[[], list[tuple[bytes, bytes]]],
             prefix: str, cpu: CpuClock | None = None) -> dict[str, Timed]:
    """`cpu`: the CPU seconds of each timed section are added to it."""
    blocks = make()
    objects = {f"{prefix}/{k.hex()}": v for k, v in blocks}
    since = cpu.now() if cpu else None
    put = client.put(objects)
    if cpu and since:
        cpu.add("store", since)
        since = cpu.now()
    got, get = client.get(list(objects))
    if cpu and since:
        cpu.add("load", since)
    assert got == list(objects.values()), f"{client.name}: other bytes came back"
    return {"store": put, "load": get}


def per_block_pass(client: S3fsAsync, make: Callable[[], list[tuple[bytes, bytes]]],
                   prefix: str) -> dict[str, Timed]:
    blocks = make()
    t0 = time.perf_counter()
    objects = {f"{prefix}/{k.hex()}": bytes(codec.encode_record(FP, k, v)) for k, v in blocks}
    encode_s = time.perf_counter() - t0
    s, lat = client.put(objects)
    got, (g, glat) = client.get(list(objects))
    t0 = time.perf_counter()  # what the tier does: parse the header, verify the checksum
    views = [codec.decode_record(buf, FP, key=key, payload_bytes=len(payload))[1]
             for (key, payload), buf in zip(blocks, got, strict=True)]
    decode_s = time.perf_counter() - t0
    assert [bytes(v) for v in views] == [p for _, p in blocks]  # untimed
    return {"store": (s + encode_s, lat), "load": (g + decode_s, glat)}


def segment_pass(client: S3fsAsync, make: Callable[[], list[tuple[bytes, bytes]]],
                 prefix: str, *, segment_bytes: int, job_blocks: int) -> dict[str, Timed]:
    blocks = make()
    size = len(blocks[0][1])
    t0 = time.perf_counter()
    objects: dict[str, bytes] = {}
    entries: list[tuple[str, segment.SegmentEntry, bytes]] = []
    for j in range(0, len(blocks), job_blocks):
        job = blocks[j:j + job_blocks]
        for group in segment.plan_segments(len(job), size, 36, segment_bytes):
            members = [job[i] for i in group]
            buf, index = segment.encode_segment(FP, members)
            name = f"{prefix}/seg-{j + group.start:08d}"
            objects[name] = bytes(buf)
            entries += [(name, e, p) for e, (_, p) in zip(index.entries, members, strict=True)]
    encode_s = time.perf_counter() - t0
    s, lat = client.put(objects)

    got, (g, glat) = client.get_ranges([(n, e.offset, e.end) for n, e, _ in entries])
    t0 = time.perf_counter()
    views = [segment.decode_member(buf, entry, FP, payload_bytes=size)[1]
             for (_, entry, _), buf in zip(entries, got, strict=True)]
    ranged_decode = time.perf_counter() - t0
    assert [bytes(v) for v in views] == [p for _, _, p in entries]  # untimed

    # the same blocks, each segment's records coalesced into as few GETs as they allow
    t0 = time.perf_counter()
    reads: list[tuple[str, int, int]] = []
    plans: list[tuple[int, Any]] = []
    by_name: dict[str, list[int]] = {}
    for i, (name, _, _) in enumerate(entries):
        by_name.setdefault(name, []).append(i)
    for name, items in by_name.items():
        for r in coalesce([(i, entries[i][1].offset, entries[i][1].length) for i in items],
                          max_gap=0, max_read=segment_bytes):
            reads.append((name, r.start, r.end))
            plans.append((len(reads) - 1, r))
    plan_s = time.perf_counter() - t0
    bufs, (c, clat) = client.get_ranges(reads)
    t0 = time.perf_counter()
    found: dict[int, memoryview] = {}
    for k, r in plans:
        view = memoryview(bufs[k])
        for item, rel, length in r.members:
            found[item] = segment.decode_member(view[rel:rel + length], entries[item][1], FP,
                                                payload_bytes=size)[1]
    coalesced_decode = time.perf_counter() - t0 + plan_s
    assert [bytes(found[i]) for i in range(len(entries))] == [p for _, _, p in entries]
    return {"store": (s + encode_s, lat), "load-ranged": (g + ranged_decode, glat),
            "load-coalesced": (c + coalesced_decode, clat)}
