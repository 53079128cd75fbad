"""Store jobs: `AsyncJobHooks` that put a job's blocks as objects, on the tier's
event loop (the core's `AsyncJobEngine`).

A work item is one PUT: a block object, or a segment of several blocks of the job.
The start hook plans the requests - which keys are held already (pinned, nothing
to copy), how the rest maps onto objects - reserves room for them (evicting by
policy; evicted objects are deleted in the background) and returns one index per
request, its *leader* (the first of its keys). The leader's item takes its slots'
checksums and PUTs the object - with the boto3 client both on the request's own
thread, the body sent from the slots themselves, never copied into one buffer
(`ObjectStore.put_made`, `client.body.PartsBody`: the slots are the job's, unchanged,
until it is reported; bytes changed behind its back would be a corrupt record,
found at load); else the parts joined on a copier thread - bounded by `timeout_s`
and the job's deadline. The end hook makes
the stored objects visible and settles the other keys the way their request went.

A key whose block object is quarantined (`holdings.index`: an object the tier cannot
prove its own) fails `rejected`: the tier never overwrites what it did not write.
A PUT of a name whose delete is in flight waits for the delete to return first.
A PUT that failed with its outcome unknown (a timeout, a dropped connection, a
server error) may still land - a frozen server writes what it held once it runs
again - while its keys were reported not stored: the tier takes the object back
(`IoContext.retract`), so the prefix never holds bytes the tier does not count.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtiers.sdk import (
    AsyncJobHooks,
    BlockKey,
    FailureReason,
    Job,
    Outcome,
    Pins,
    Reservation,
    Verdict,
)

from kvtiers_s3.client.body import Buffer, joined
from kvtiers_s3.client.objects import classify, refused
from kvtiers_s3.holdings.index import Member, StoredObject, segment_oid
from kvtiers_s3.jobs.iocontext import IoContext, engine_failure
from kvtiers_s3.jobs.latency import STORE
from kvtiers_s3.layout import codec, segment
from kvtiers_s3.layout.names import block_name, segment_name

__all__ = ["StorePlan", "Stores"]


@dataclass(slots=True)
class Put:
    """One planned PUT: the object's name, index id and size, the job's indices in it."""

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
    puts: dict[int, Put] = field(default_factory=dict)  # leader -> request
    stored: dict[int, StoredObject] = field(default_factory=dict)  # leader -> object
    failed: dict[int, FailureReason] = field(default_factory=dict)  # leader -> why
    key_failed: dict[int, FailureReason] = field(default_factory=dict)  # a slot's own


class Stores:
    """The store hooks of one tier (`hooks`); a job's state is a `StorePlan`."""

    def __init__(self, io: IoContext):
        self.io = io
        self.packs = io.settings.layout.packs(io.block_bytes)
        self.writer = int.from_bytes(os.urandom(8), "big")
        self._seq = itertools.count()
        self.hooks = AsyncJobHooks(start=self._plan, block=self._store, end=self._end)

    def _plan(self, job: Job) -> list[int]:
        io = self.io
        plan: StorePlan = job.state
        # Held already: nothing to copy, and pinned until the job ends, so that the
        # room for its other blocks is never made by evicting these.
        plan.present, held = io.holdings.pin(job.keys)
        plan.held = [job.keys[i] for i, obj in enumerate(held) if obj is not None]
        todo = []
        for i, obj in enumerate(held):
            if obj is not None:
                job.succeed(i)
            else:
                todo.append(i)
        if not todo:
            return []
        puts = []
        for put in self._requests(job, todo):
            if not put.packed and io.holdings.quarantined(put.name) is not None:
                job.fail(put.indices[0], FailureReason.REJECTED)  # not ours to overwrite
            else:
                puts.append(put)
        if not puts:
            return []
        room = io.holdings.reserve([(p.oid, p.size) for p in puts])
        plan.room = room
        if room.evicted:
            io.stats.evicted(len(room.evicted))
            io.delete_later([obj for _, obj in room.evicted])
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

    def _requests(self, job: Job, todo: list[int]) -> list[Put]:
        """The objects that the job's indices `todo` are stored as."""
        io, bb = self.io, self.io.block_bytes
        if not self.packs:
            return [Put(block_name(io.ns_root, job.keys[i]), bytes(job.keys[i]),
                        codec.header_bytes(len(job.keys[i])) + bb, [i], False) for i in todo]
        puts = []
        klen = max(len(job.keys[i]) for i in todo)
        # A segment never outgrows the tier: a job larger than capacity_bytes
        # stores what fits instead of nothing.
        limit = min(io.settings.layout.segment_bytes, io.holdings.index.capacity_bytes)
        for group in segment.plan_segments(len(todo), bb, klen, limit):
            idx = [todo[g] for g in group]
            name = segment_name(io.ns_root, self.writer, next(self._seq))
            size = segment.segment_bytes([job.keys[i] for i in idx], bb)
            puts.append(Put(name, segment_oid(name), size, idx, True))
        return puts

    async def _store(self, job: Job, leader: int) -> Outcome:
        io = self.io
        plan: StorePlan = job.state
        put = plan.puts[leader]
        made: list[dict[BlockKey, Member]] = []

        def make() -> Sequence[Buffer] | None:
            parts, members = self._encode(job, put, plan.key_failed)
            made.append(members)
            return parts if members else None

        began = time.perf_counter()
        sent = False
        try:
            if put.name in io.deleting:  # a delete landing after the PUT would take it
                await asyncio.wait_for(io.deleted(put.name), io.timeout(job))
            if io.store.streams:  # sent from the slots on the request's own thread
                sent = True
                await asyncio.wait_for(io.store.put_made(put.name, make), io.timeout(job))
            else:
                data = await io.off_loop(lambda: None if (p := make()) is None else joined(p))
                if data is not None:
                    sent = True
                    await asyncio.wait_for(io.store.put(put.name, data), io.timeout(job))
        except Exception as exc:  # noqa: BLE001 - every failure is a reason, never raised
            reason = classify(exc)
            io.errors.record("store", exc)
            plan.failed[leader] = reason
            if sent and not refused(exc):  # it may land yet, uncounted: taken back
                io.retract(put.name)
            return reason
        members = made[0] if made else {}
        if not members:
            return plan.key_failed.get(leader, FailureReason.IO)
        io.latency.record(STORE, time.perf_counter() - began)
        plan.stored[leader] = StoredObject(put.oid, put.name, put.size, members, time.time(),
                                           packed=put.packed)
        return plan.key_failed.get(leader)

    def _encode(self, job: Job, put: Put, failed: dict[int, FailureReason]
                ) -> tuple[Sequence[Buffer], dict[BlockKey, Member]]:
        """The object as parts - headers and the slots themselves, not copied
        (`client.body.PartsBody`) - with each block's checksum taken from its slot (the
        request's thread or a copier thread: the pool may be slow). A slot that
        cannot be read fails its key alone (in `failed`)."""
        io = self.io
        pool, keys, slots = io.ctx.pool, job.keys, job.slots
        blocks = []
        for i in put.indices:
            try:
                blocks.append((keys[i], pool.block(slots[i])))
            except OSError as exc:
                io.errors.record("store.slot", exc)
                failed[i] = FailureReason.IO
        if not blocks:
            return [], {}
        if put.packed:
            parts, index = segment.segment_parts(io.fingerprint, blocks)
            return parts, {e.key: Member(e.offset, e.length, e.checksum) for e in index.entries}
        key, block = blocks[0]
        parts = codec.record_parts(io.fingerprint, key, block)
        return parts, {key: Member(0, sum(len(p) for p in parts))}

    def _end(self, job: Job) -> None:
        io = self.io
        plan: StorePlan = job.state
        if plan.present is not None:
            plan.present.release()
            io.holdings.touch(plan.held)
        if plan.room is None:
            return
        with plan.room as room:
            for leader, put in sorted(plan.puts.items()):  # a prefix's first blocks are older
                obj = plan.stored.get(leader)
                if obj is not None:  # stored: its blocks, not the slots that failed
                    io.verdicts.forget(obj.name)  # a new object under that name
                    io.holdings.commit(room, obj)
                    for i in put.indices[1:]:
                        if i in plan.key_failed:
                            job.fail(i, plan.key_failed[i])
                        else:
                            job.succeed(i, io.block_bytes)
                else:
                    why = plan.failed.get(leader) or engine_failure(job)
                    for i in put.indices[1:]:
                        job.fail(i, why)
