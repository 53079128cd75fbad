"""Load jobs: `AsyncJobHooks` that read a job's blocks into its slots, on the tier's
event loop (the core's `AsyncJobEngine`).

What `lookup` called a HIT is pinned at submit (`LoadPlan.pins`). A work item is one
GET: a block object, or a coalesced run of records of one segment (`ranges`). The
start hook groups the job's keys by object and returns one index per read, its
*leader* (the first of its keys); the leader's item does the GET - streamed straight
into the slots where the client streams, else read whole and placed on a copier
thread (`placing.Placer`) - bounded by `timeout_s` and the job's deadline, its time
recorded (`latency`, from the GET to its blocks verified in their slots); the end
hook settles the other keys the way their read went, releases the pins and touches
what loaded. A broken record (corrupt, truncated, another key's; any record of a
segment that is not what its index says) fails `corrupt`, leaves the index, and its
object is deleted once no block of it is live; a block object whose magic alone is
damaged is proven ours by its header checksum (`layout.proof`) and goes the same
way. A block object that is not provably ours (no kvtiers-s3 magic and no such
proof, another format's or namespace's record) is a miss, never deleted, and
quarantined (`holdings.index`: its bytes stay counted). Either way the object is
remembered as bad with its ETag, size and store time (`holdings.verdicts`) before
the job is reported: probes and listings leave it out until it changes, so it is
never a HIT again that fails again. A vanished object is a miss.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from kvtiers.sdk import AsyncJobHooks, FailureReason, Job, Pins

from kvtiers_s3.client.objects import ObjectInfo, classify
from kvtiers_s3.holdings.index import StoredObject
from kvtiers_s3.jobs.iocontext import IoContext, engine_failure
from kvtiers_s3.jobs.latency import LOAD
from kvtiers_s3.jobs.placing import Placed, Placer
from kvtiers_s3.jobs.ranges import Read, coalesce
from kvtiers_s3.layout import codec
from kvtiers_s3.layout.codec import Reason

__all__ = ["LoadPlan", "Loads"]


@dataclass(slots=True)
class LoadPlan:
    pins: Pins[StoredObject] | None
    objects: list[StoredObject | None]
    reads: dict[int, tuple[StoredObject, Read]] = field(default_factory=dict)
    outcomes: dict[int, FailureReason | None] = field(default_factory=dict)  # any key


class Loads:
    """The load hooks of one tier (`hooks`); a job's state is a `LoadPlan`."""

    def __init__(self, io: IoContext):
        self.io = io
        self.placer = Placer(io.ctx, io.errors)
        self.hooks = AsyncJobHooks(start=self._plan, block=self._load, end=self._end)

    def _plan(self, job: Job) -> list[int]:
        io = self.io
        plan: LoadPlan = job.state
        by_object: dict[int, list[int]] = {}
        objects: dict[int, StoredObject] = {}
        for i, key in enumerate(job.keys):
            obj = plan.objects[i] if i < len(plan.objects) else None
            if obj is None:
                obj = io.holdings.lookup(key)  # stored since submit (not pinned)
            member = obj.members.get(key) if obj is not None else None
            if obj is None or member is None:
                job.fail(i, FailureReason.MISSING)
                continue
            by_object.setdefault(id(obj), []).append(i)
            objects[id(obj)] = obj
        leaders = []
        gap = codec.header_bytes(36) + io.block_bytes  # read past one record, not more
        for oid, indices in by_object.items():
            obj = objects[oid]
            wanted = [(i, obj.members[job.keys[i]].offset, obj.members[job.keys[i]].length)
                      for i in indices]
            for read in coalesce(wanted, max_gap=gap,
                                 max_read=max(io.settings.layout.segment_bytes, gap)):
                leader = read.members[0][0]
                plan.reads[leader] = (obj, read)
                leaders.append(leader)
        return leaders

    async def _load(self, job: Job, leader: int) -> FailureReason | None:
        io, placer = self.io, self.placer
        plan: LoadPlan = job.state
        obj, read = plan.reads[leader]
        began = time.perf_counter()
        try:
            if io.store.streams:  # straight into the slots, checked there
                placed = await asyncio.wait_for(io.store.stream(
                    obj.name, read.start, read.end,
                    lambda body: placer.place_stream(job, obj, read, body)), io.timeout(job))
                io.latency.record(LOAD, time.perf_counter() - began)
                return await self._settle(job, obj, read, placed, leader)
            data = await asyncio.wait_for(io.store.get(obj.name, read.start, read.end),
                                          io.timeout(job))
        except Exception as exc:  # noqa: BLE001 - every failure is a reason, never raised
            reason = classify(exc)
            if reason is FailureReason.MISSING:  # deleted behind us (another engine evicted it)
                io.holdings.drop(obj)
            else:
                io.errors.record("load", exc)
            for i, _, _ in read.members:
                plan.outcomes[i] = reason
            return reason
        placed = await io.off_loop(placer.place_all, job, obj, read, data)
        io.latency.record(LOAD, time.perf_counter() - began)
        return await self._settle(job, obj, read, placed, leader)

    async def _settle(self, job: Job, obj: StoredObject, read: Read, placed: list[Placed],
                      leader: int) -> FailureReason | None:
        plan: LoadPlan = job.state
        for (i, _, _), outcome in zip(read.members, placed, strict=True):
            # not provably ours: a miss to the engine
            plan.outcomes[i] = FailureReason.MISSING if isinstance(outcome, Reason) else outcome
        if not obj.packed:
            failed = placed[0]  # a block object is one record
            if failed is not None:
                await self._judge(job, obj, failed)
            return plan.outcomes[leader]
        for (i, _, _), outcome in zip(read.members, placed, strict=True):
            if outcome is not None and self.io.holdings.drop(obj, job.keys[i]):
                self.io.delete_names([obj.name])  # ours and broken, no live block left
        return plan.outcomes[leader]

    async def _judge(self, job: Job, obj: StoredObject, outcome: FailureReason | Reason) -> None:
        """On the loop, before the job is reported (so that no lookup after it finds
        the object again): remember the block object `obj` as bad by what the store
        says identifies its bytes - from the listing or HEAD that found it, or (an
        object this engine stored, whose ETag it never saw) a HEAD now, judged by its
        size alone if that fails - then delete it (ours and broken) or quarantine it
        (not provably ours: counted, never deleted)."""
        io = self.io
        info: ObjectInfo | None = ObjectInfo(obj.name, obj.size, obj.mtime, obj.etag)
        if obj.etag is None:
            try:
                info = await asyncio.wait_for(io.store.info(obj.name), io.timeout(job))
            except Exception as exc:  # noqa: BLE001 - judged by its size alone, then
                io.errors.record("load", exc)
                info = ObjectInfo(obj.name, obj.size, None, None)
        if info is None:  # gone meanwhile: nothing to remember or delete
            io.holdings.drop(obj)
            return
        io.verdicts.remember(info, outcome if isinstance(outcome, Reason) else Reason.CORRUPT)
        if not isinstance(outcome, Reason):
            if io.holdings.drop(obj):
                io.delete_names([obj.name])
            return
        doomed = io.holdings.quarantine(obj)
        if doomed:
            io.stats.evicted(len(doomed))
            io.delete_later(doomed)

    def _end(self, job: Job) -> None:
        io = self.io
        plan: LoadPlan = job.state
        for leader, (_, read) in plan.reads.items():
            for i, _, _ in read.members[1:]:
                if i in plan.outcomes:
                    outcome = plan.outcomes[i]
                    if outcome is None:
                        job.succeed(i, io.block_bytes)
                    else:
                        job.fail(i, outcome)
                elif not job.succeeded(leader):
                    job.fail(i, engine_failure(job))
        if plan.pins is not None:
            plan.pins.release()
        io.holdings.touch(k for i, k in enumerate(job.keys) if job.succeeded(i))
