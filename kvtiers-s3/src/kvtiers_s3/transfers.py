"""The work of store and load jobs: `AsyncJobHooks` for the core's
`AsyncJobEngine`, on the tier's event loop.

A work item is one *request*: one object PUT for a store (a block, or a segment of
several blocks of the job), one GET for a load (a block object, or a coalesced
range of records of one segment). The start hook plans the requests - which keys
need no I/O, how the rest maps onto objects or reads - and returns one index per
request, its *leader* (the first of its keys); the leader's item does the request
for every key in it, and the end hook settles the other keys the way their
request went. A request is bounded by `timeout_s` (and the job's deadline).

Stores: the slot bytes are copied into the object with their checksum taken from
the same bytes (`codec` / `segment`), room is reserved in the start hook (evicting
by policy; evicted objects are deleted in the background), the objects become
visible in the end hook, after their PUT returned. Loads: what `lookup` called a
HIT is pinned at submit; each record read is parsed (key, namespace, length),
copied into its slot and the slot verified before the key succeeds. A broken
record (corrupt, truncated, another key's) fails with `corrupt`, leaves the index
and its object is deleted once no block of it is live; another format's or
namespace's object is a miss, left alone; a vanished one is a miss.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvtiers.integrity import verify
from kvtiers.jobs import FailureReason
from kvtiers.keys import BlockKey
from kvtiers.sdk import AsyncJobHooks, Job, Outcome, Pins, Reservation, Verdict
from kvtiers.stats import StatsRecorder
from kvtiers.tier import TierContext

from kvtiers_s3 import codec, segment
from kvtiers_s3.catalog import BROKEN
from kvtiers_s3.codec import FormatError
from kvtiers_s3.errorlog import ErrorLog
from kvtiers_s3.holdings import Holdings, Member, StoredObject, segment_oid
from kvtiers_s3.names import block_name, segment_name
from kvtiers_s3.objects import ObjectStore, classify
from kvtiers_s3.ranges import Read, coalesce
from kvtiers_s3.settings import S3Settings

__all__ = ["LoadPlan", "StorePlan", "Transfers"]

T = TypeVar("T")


@dataclass(slots=True)
class _Put:
    name: str
    oid: bytes
    size: int
    indices: list[int]
    packed: bool


@dataclass(slots=True)
class StorePlan:
    present: Pins[StoredObject] | None = None  # blocks held already, pinned for the job
    held: list[BlockKey] = field(default_factory=list)  # their keys
    room: Reservation[StoredObject] | None = None
    puts: dict[int, _Put] = field(default_factory=dict)  # leader -> request
    stored: dict[int, StoredObject] = field(default_factory=dict)  # leader -> object
    failed: dict[int, FailureReason] = field(default_factory=dict)  # leader -> why
    key_failed: dict[int, FailureReason] = field(default_factory=dict)  # a slot's own


@dataclass(slots=True)
class LoadPlan:
    pins: Pins[StoredObject] | None
    objects: list[StoredObject | None]
    reads: dict[int, tuple[StoredObject, Read]] = field(default_factory=dict)
    outcomes: dict[int, Outcome] = field(default_factory=dict)  # any key -> outcome


class Transfers:
    """The hooks of one tier (`load_hooks`, `store_hooks`). `spawn(coro)` runs a
    background coroutine on the loop (deletes), tracked by the tier; it is called
    on the loop thread only."""

    store: ObjectStore  # set by `attach`, once the tier's loop exists

    def __init__(self, ctx: TierContext, settings: S3Settings, holdings: Holdings,
                 ns_root: str, stats: StatsRecorder, errors: ErrorLog,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]):
        self.ctx = ctx
        self.settings = settings
        self.holdings = holdings
        self.ns_root = ns_root
        self.fingerprint = ctx.namespace.fingerprint
        self.block_bytes = ctx.block_bytes
        self.packs = settings.layout.packs(ctx.block_bytes)
        self.stats = stats
        self.errors = errors
        self.spawn = spawn
        self.writer = int.from_bytes(os.urandom(8), "big")
        #: names of objects being deleted (the loop thread's)
        self.deleting: set[str] = set()
        # Slot copies and checksums run here, off the loop: a pool access may be slow
        # (a page fault, a test's gate), and the loop must keep serving other requests.
        self.copier = ThreadPoolExecutor(max(1, min(4, settings.concurrency)),
                                         thread_name_prefix=f"kvtiers-{ctx.name or 's3'}-copy")
        self._seq = itertools.count()
        self.load_hooks = AsyncJobHooks(start=self._plan_load, block=self._load, end=self._end_load)
        self.store_hooks = AsyncJobHooks(start=self._plan_store, block=self._store,
                                         end=self._end_store)

    def attach(self, store: ObjectStore) -> None:
        self.store = store

    def _timeout(self, job: Job) -> float:
        limit = self.settings.timeout_s
        deadline = job.transfer.deadline
        if deadline is not None:
            limit = min(limit, max(1e-3, deadline - self.ctx.clock()))
        return limit

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a copier thread. Cancelled (the tier closing), it still
        waits for the thread: the job's slots must be untouched once it is reported."""
        fut = asyncio.get_running_loop().run_in_executor(self.copier, fn, *args)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])
            raise

    def delete_later(self, objects: Sequence[StoredObject]) -> None:
        """Delete objects in the background (on the loop thread)."""
        if objects:
            self.delete_names([o.name for o in objects])

    def delete_names(self, names: list[str]) -> None:
        # Until the delete returns, a probe or listing that still finds these objects
        # must not take them back in (they would evict live blocks for dead ones).
        self.deleting.update(names)
        self.spawn(self._delete(names))

    async def _delete(self, names: list[str]) -> None:
        try:
            await asyncio.wait_for(self.store.delete(names), self.settings.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a failed delete leaves an orphan, no more
            self.errors.record("delete", exc)
        finally:
            self.deleting.difference_update(names)

    # -- stores -------------------------------------------------------------------

    def _plan_store(self, job: Job) -> list[int]:
        plan: StorePlan = job.state
        bb = self.block_bytes
        # Held already: nothing to copy, and pinned until the job ends, so that the
        # room for its other blocks is never made by evicting these.
        plan.present, held = self.holdings.pin(job.keys)
        plan.held = [job.keys[i] for i, obj in enumerate(held) if obj is not None]
        todo = []
        for i, obj in enumerate(held):
            if obj is not None:
                job.succeed(i)
            else:
                todo.append(i)
        if not todo:
            return []
        puts: list[_Put] = []
        if self.packs:
            klen = max(len(job.keys[i]) for i in todo)
            # A segment never outgrows the tier: a job larger than capacity_bytes
            # stores what fits instead of nothing.
            limit = min(self.settings.layout.segment_bytes, self.holdings.index.capacity_bytes)
            for group in segment.plan_segments(len(todo), bb, klen, limit):
                idx = [todo[g] for g in group]
                name = segment_name(self.ns_root, self.writer, next(self._seq))
                size = segment.segment_bytes([job.keys[i] for i in idx], bb)
                puts.append(_Put(name, segment_oid(name), size, idx, True))
        else:
            for i in todo:
                key = job.keys[i]
                puts.append(_Put(block_name(self.ns_root, key), bytes(key),
                                 codec.header_bytes(len(key)) + bb, [i], False))
        room = self.holdings.reserve([(p.oid, p.size) for p in puts])
        plan.room = room
        if room.evicted:
            self.stats.evicted(len(room.evicted))
            self.delete_later([obj for _, obj in room.evicted])
        leaders = []
        for put, verdict in zip(puts, room.verdicts, strict=True):
            if verdict is Verdict.RESERVED:
                plan.puts[put.indices[0]] = put
                leaders.append(put.indices[0])
            else:
                for i in put.indices:
                    if verdict is Verdict.PRESENT:
                        job.succeed(i)
                    else:
                        job.fail(i, FailureReason.FULL)
        return leaders

    async def _store(self, job: Job, leader: int) -> Outcome:
        plan: StorePlan = job.state
        put = plan.puts[leader]
        data, members = await self._off_loop(self._encode, job, put, plan.key_failed)
        if not members:
            return plan.key_failed.get(leader, FailureReason.IO)
        try:
            await asyncio.wait_for(self.store.put(put.name, data), self._timeout(job))
        except Exception as exc:  # noqa: BLE001 - every failure is a reason, never raised
            reason = classify(exc)
            self.errors.record("store", exc)
            plan.failed[leader] = reason
            if put.packed:  # it may have landed: no orphan left behind
                self.delete_names([put.name])
            return reason
        plan.stored[leader] = StoredObject(put.oid, put.name, put.size, members, time.time(),
                                           packed=put.packed)
        return plan.key_failed.get(leader)

    def _encode(self, job: Job, put: _Put,
                failed: dict[int, FailureReason]) -> tuple[bytearray, dict[BlockKey, Member]]:
        """The object's bytes from the slots (a copier thread: the pool may be slow).
        A slot that cannot be read fails its key alone (in `failed`)."""
        pool, keys, slots = self.ctx.pool, job.keys, job.slots
        blocks = []
        for i in put.indices:
            try:
                blocks.append((keys[i], pool.block(slots[i])))
            except OSError as exc:
                self.errors.record("store.slot", exc)
                failed[i] = FailureReason.IO
        if not blocks:
            return bytearray(), {}
        if put.packed:
            data, index = segment.encode_segment(self.fingerprint, blocks)
            return data, {e.key: Member(e.offset, e.length, e.checksum) for e in index.entries}
        key, block = blocks[0]
        data = codec.encode_record(self.fingerprint, key, block)
        return data, {key: Member(0, len(data))}

    def _end_store(self, job: Job) -> None:
        plan: StorePlan = job.state
        if plan.present is not None:
            plan.present.release()
            self.holdings.touch(plan.held)
        if plan.room is None:
            return
        with plan.room as room:
            for leader, put in sorted(plan.puts.items()):  # a prefix's first blocks are older
                obj = plan.stored.get(leader)
                if obj is not None:  # stored: its blocks, not the slots that failed
                    self.holdings.commit(room, obj)
                    for i in put.indices[1:]:
                        if i in plan.key_failed:
                            job.fail(i, plan.key_failed[i])
                        else:
                            job.succeed(i, self.block_bytes)
                else:
                    why = plan.failed.get(leader) or _engine_failure(job)
                    for i in put.indices[1:]:
                        job.fail(i, why)

    # -- loads --------------------------------------------------------------------

    def _plan_load(self, job: Job) -> list[int]:
        plan: LoadPlan = job.state
        by_object: dict[int, list[int]] = {}
        objects: dict[int, StoredObject] = {}
        for i, key in enumerate(job.keys):
            obj = plan.objects[i] if i < len(plan.objects) else None
            if obj is None:
                obj = self.holdings.lookup(key)  # stored since submit (not pinned)
            member = obj.members.get(key) if obj is not None else None
            if obj is None or member is None:
                job.fail(i, FailureReason.MISSING)
                continue
            by_object.setdefault(id(obj), []).append(i)
            objects[id(obj)] = obj
        leaders = []
        gap = codec.header_bytes(36) + self.block_bytes  # read past one record, not more
        for oid, indices in by_object.items():
            obj = objects[oid]
            wanted = [(i, obj.members[job.keys[i]].offset, obj.members[job.keys[i]].length)
                      for i in indices]
            for read in coalesce(wanted, max_gap=gap,
                                 max_read=max(self.settings.layout.segment_bytes, gap)):
                leader = read.members[0][0]
                plan.reads[leader] = (obj, read)
                leaders.append(leader)
        return leaders

    async def _load(self, job: Job, leader: int) -> Outcome:
        plan: LoadPlan = job.state
        obj, read = plan.reads[leader]
        try:
            if self.store.streams:  # straight into the slots, checked there
                placed = await asyncio.wait_for(self.store.stream(
                    obj.name, read.start, read.end,
                    lambda body: self._place_stream(job, obj, read, body)), self._timeout(job))
                return self._settle_placed(job, obj, read, placed, leader)
            data = await asyncio.wait_for(self.store.get(obj.name, read.start, read.end),
                                          self._timeout(job))
        except Exception as exc:  # noqa: BLE001 - every failure is a reason, never raised
            reason = classify(exc)
            if reason is FailureReason.MISSING:  # deleted behind us (another engine evicted it)
                self.holdings.drop(obj)
            else:
                self.errors.record("load", exc)
            for i, _, _ in read.members:
                plan.outcomes[i] = reason
            return reason
        placed = await self._off_loop(self._place_all, job, obj, read, data)
        return self._settle_placed(job, obj, read, placed, leader)

    def _settle_placed(self, job: Job, obj: StoredObject, read: Read, placed: list[Outcome],
                       leader: int) -> Outcome:
        plan: LoadPlan = job.state
        for (i, _, _), outcome in zip(read.members, placed, strict=True):
            plan.outcomes[i] = outcome
            if outcome is not None:
                self._settle_bad(obj, job.keys[i], outcome)
        return plan.outcomes[leader]

    def _place_stream(self, job: Job, obj: StoredObject, read: Read, body: Any) -> list[Outcome]:
        """On the request's thread: read the records of `read` from `body` in order,
        each block straight into its slot, each slot verified."""
        out: list[Outcome] = []
        pos = 0
        for i, rel, length in read.members:
            if rel > pos and len(_read_exact(body, rel - pos)) < rel - pos:
                out.append(self._bad(obj, True, "the object ended early"))
                pos = rel
                continue
            out.append(self._place_from(job, i, obj, body, length))
            pos = rel + length
        return out

    def _place_from(self, job: Job, i: int, obj: StoredObject, body: Any,
                    length: int) -> Outcome:
        key = job.keys[i]
        head_len = codec.header_bytes(len(key))
        head = _read_exact(body, head_len)
        try:
            header = codec.decode_header(head, self.fingerprint)
        except FormatError as exc:
            _read_exact(body, length - len(head))  # keep the stream at the next record
            return self._bad(obj, exc.reason in BROKEN, str(exc))
        if header.key != key or header.payload_bytes != self.block_bytes \
                or header.record_bytes != length:
            _read_exact(body, length - len(head))
            return self._bad(obj, True, "the record is not this block's")
        member = obj.members.get(key)
        if member is not None and member.checksum is not None \
                and member.checksum != header.checksum:
            _read_exact(body, length - len(head))
            return self._bad(obj, True, "the record does not match the segment index")
        slot = self.ctx.pool.block(job.slots[i])
        if _readinto_exact(body, slot) < len(slot):
            return self._bad(obj, True, "truncated: the object ended inside the block")
        if not verify(slot, header.checksum):
            return self._bad(obj, True, "block checksum mismatch")
        return None

    def _place_all(self, job: Job, obj: StoredObject, read: Read,
                   data: bytes) -> list[Outcome]:
        view = memoryview(data)
        return [self._place(job, i, obj, view[rel:rel + length])
                for i, rel, length in read.members]

    def _place(self, job: Job, i: int, obj: StoredObject, record: memoryview) -> Outcome:
        """Parse one record, copy its block into the slot, verify the slot."""
        key = job.keys[i]
        member = obj.members.get(key)
        try:
            header, payload = codec.decode_record(record, self.fingerprint, key=key,
                                                  payload_bytes=self.block_bytes, verify=False)
        except FormatError as exc:
            return self._bad(obj, exc.reason in BROKEN, str(exc))
        if member is not None and member.checksum is not None \
                and member.checksum != header.checksum:
            return self._bad(obj, True, "the record does not match the segment index")
        slot = self.ctx.pool.block(job.slots[i])
        slot[:] = payload
        if not verify(slot, header.checksum):
            return self._bad(obj, True, "block checksum mismatch")
        return None

    def _bad(self, obj: StoredObject, broken: bool, why: str) -> Outcome:
        """Count and log a record that is not the block (any thread)."""
        if broken:
            self.errors.note("load", "corrupt", f"{obj.name}: {why}; removed")
            return FailureReason.CORRUPT
        self.errors.note("load", "foreign", f"{obj.name}: {why}; left alone")
        return FailureReason.MISSING

    def _settle_bad(self, obj: StoredObject, key: BlockKey, outcome: FailureReason) -> None:
        """On the loop: a broken record leaves the index, its object goes once no
        block of it is live; another format's stays where it is."""
        if self.holdings.drop(obj, key) and outcome is FailureReason.CORRUPT:
            self.delete_names([obj.name])

    def _end_load(self, job: Job) -> None:
        plan: LoadPlan = job.state
        for leader, (_, read) in plan.reads.items():
            for i, _, _ in read.members[1:]:
                if i in plan.outcomes:
                    outcome = plan.outcomes[i]
                    if outcome is None:
                        job.succeed(i, self.block_bytes)
                    else:
                        job.fail(i, outcome)
                elif not job.succeeded(leader):
                    job.fail(i, _engine_failure(job))
        if plan.pins is not None:
            plan.pins.release()
        self.holdings.touch(k for i, k in enumerate(job.keys) if job.succeeded(i))


def _engine_failure(job: Job) -> FailureReason:
    """Why a request the engine never ran (or cut short) failed, for its other keys."""
    return FailureReason.TIMEOUT if job.expired() else FailureReason.CLOSED


def _read_exact(body: Any, n: int) -> bytes:
    """Up to `n` bytes (fewer only at the end of the body)."""
    parts, left = [], n
    while left > 0:
        chunk = body.read(left)
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _readinto_exact(body: Any, dest: memoryview) -> int:
    """Fill `dest` from `body`; the bytes read (fewer only at the end of the body)."""
    view = memoryview(dest).cast("B")
    got = 0
    while got < len(view):
        n = body.readinto(view[got:])
        if not n:
            break
        got += n
    return got
