"""`Transfers`: the load and store hooks of one `redis` tier (`AsyncJobHooks` for
the core's `AsyncJobEngine`), and what their requests share.

A work item is one key: one GET or one SET, bounded by `timeout_s` and the job's
deadline (whichever is nearer), so a server that went away, or hangs, costs
misses within the deadline - never a hang. The slot bytes are read and written
on a copier thread, not on the loop: a pool access may be slow (a page fault, a
test's gate) and the loop must keep serving the other requests.

Loads: what `lookup` called a HIT was pinned at submit. The value's header must
name this key, this namespace and this block size, and the block's checksum is
verified on the bytes once they are in the slot. A value of another format or
namespace at our name is a miss, left alone; a damaged one (this format, this
key, bad checksum, cut short) fails `corrupt` and is deleted; a missing one
(expired, evicted by Redis's own maxmemory, lost by a server restart) is a miss.
Each leaves the index.

Stores: the start hook reserves room in the index (evicting by policy; evicted
values are deleted in the background) and runs one item per new key; the end hook
makes what was SET visible to `lookup`. With `ttl_s`, each SET carries a Redis
expiry (`PX`), and the index remembers when it ends (wall-clock ms).

Threads: built on the scheduler thread (the tier's constructor); `attach` once
the client exists on the loop; everything else on the loop thread, except the
functions `off_loop` runs on a copier thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from kvtiers import integrity
from kvtiers.jobs import FailureReason
from kvtiers.sdk import AsyncJobHooks, BoundedIndex, Job, Outcome, Pins, Reservation, Verdict
from kvtiers.stats import StatsRecorder
from kvtiers.tier import TierContext
from redis.exceptions import RedisError, ResponseError

from kvtiers_redis import record
from kvtiers_redis.errorlog import ErrorLog
from kvtiers_redis.names import Names
from kvtiers_redis.settings import RedisSettings

__all__ = ["Transfers", "wall_ms"]

T = TypeVar("T")
#: what a request may fail with that is the server's or the network's, not a bug
EXPECTED = (RedisError, OSError, asyncio.TimeoutError)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class _Stored:
    room: Reservation[int]
    written: dict[int, int] = field(default_factory=dict)  # index -> expiry (ms, 0: none)


class Transfers:
    """`load` and `store` are the engine's hooks; `spawn` runs a background
    coroutine on the loop (the tier's, tracked there)."""

    client: aioredis.Redis  # set by `attach`, on the loop

    def __init__(self, ctx: TierContext, settings: RedisSettings, index: BoundedIndex[int],
                 names: Names, stats: StatsRecorder, errors: ErrorLog,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]):
        self.ctx = ctx
        self.settings = settings
        self.index = index
        self.names = names
        self.stats = stats
        self.errors = errors
        self.spawn = spawn
        self.fingerprint = ctx.namespace.fingerprint
        self.block_bytes = ctx.block_bytes
        self.ttl_ms = int(settings.ttl_s * 1000) if settings.ttl_s > 0 else 0
        self.copier = ThreadPoolExecutor(max(1, settings.concurrency),
                                         thread_name_prefix=f"kvtiers-{ctx.name or 'redis'}-copy")
        self.load = AsyncJobHooks(block=self._load, end=self._end_load)
        self.store = AsyncJobHooks(start=self._reserve, block=self._store, end=self._end_store)

    def attach(self, client: aioredis.Redis) -> None:
        self.client = client

    # Shared by both kinds.

    def timeout(self, job: Job | None = None) -> float:
        """How long one request may take: `timeout_s`, or less where the job's
        deadline (on the tier's clock) is nearer."""
        limit = self.settings.timeout_s
        deadline = None if job is None else job.transfer.deadline
        if deadline is not None:
            limit = min(limit, max(1e-3, deadline - self.ctx.clock()))
        return limit

    async def request(self, job: Job, op: str, call: Awaitable[T]) -> T | FailureReason:
        """`call`'s result, or why it failed: `timeout` once the job's deadline has
        passed, `missing` for a value of another type at the name (not ours), else
        `io` (counted and logged once per kind, scrubbed)."""
        try:
            return await asyncio.wait_for(call, self.timeout(job))
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                self.errors.record(op, exc)
                return FailureReason.IO
            self.errors.note(op, "wrongtype", "a value of another type at a block's name")
            return FailureReason.MISSING
        except EXPECTED as exc:
            if job.expired():
                return FailureReason.TIMEOUT
            self.errors.record(op, exc)
            return FailureReason.IO

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a copier thread. Cancelled (the tier closing), it still
        waits for the thread: the job's slots must be untouched once it is reported."""
        fut = asyncio.get_running_loop().run_in_executor(self.copier, fn, *args)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])
            raise

    def unlink_later(self, keys: list[bytes]) -> None:
        """Delete the values of `keys` in the background (on the loop thread)."""
        if keys:
            self.spawn(self.unlink([self.names.block(k) for k in keys]))

    async def unlink(self, names: list[bytes]) -> None:
        try:
            for at in range(0, len(names), 512):
                await asyncio.wait_for(self.client.unlink(*names[at:at + 512]), self.timeout())
        except EXPECTED as exc:  # a value left behind is found again at start-up
            self.errors.record("delete", exc)

    # Loads.

    async def _load(self, job: Job, i: int) -> Outcome:
        key = job.keys[i]
        pins: Pins[int] | None = job.state
        location = pins.locations[i] if pins is not None else self.index.get(key)
        if location is None:
            return FailureReason.MISSING
        name = self.names.block(key)
        value = await self.request(job, "load", self.client.get(name))
        if value is FailureReason.MISSING or value is None:
            # Expired, evicted by the server, lost in its restart, or (MISSING) a
            # value of another type at our name.
            self.index.remove(key, location)
            return FailureReason.MISSING
        if not isinstance(value, bytes):
            return value if isinstance(value, FailureReason) else FailureReason.IO
        bad = record.check_header(value, self.fingerprint, key, self.block_bytes)
        if bad is None and await self.off_loop(self._place, job, i, value):
            return None
        if bad is not None and bad is not record.Bad.BROKEN:
            # Another program's value, or another model's block, at our name: not ours
            # to delete, and never served.
            self.errors.note("load", bad.value, f"the value at {name!r} is {bad.value}")
            self.index.remove(key, location)
            return FailureReason.MISSING
        # Ours and damaged: deleted before the index lets go of it, so that no store
        # of this key can start writing while the damaged copy is still there.
        await self.request(job, "delete", self.client.unlink(name))
        self.index.remove(key, location)
        return FailureReason.CORRUPT

    def _place(self, job: Job, i: int, value: bytes) -> bool:
        """Copy the block into its slot and verify it there (a copier thread)."""
        parsed = record.parse_header(value)
        assert parsed is not None  # check_header passed
        _, _, _, expected, start = parsed
        dest = self.ctx.pool.block(job.slots[i])
        dest[:] = memoryview(value)[start:]
        return integrity.verify(dest, expected)

    def _end_load(self, job: Job) -> None:
        pins: Pins[int] | None = job.state
        if pins is not None:
            pins.release()
        self.index.touch([k for i, k in enumerate(job.keys) if job.succeeded(i)])

    # Stores.

    def _reserve(self, job: Job) -> list[int]:
        room = self.index.reserve([(k, self.block_bytes) for k in job.keys])
        job.state = _Stored(room)
        if room.evicted:
            self.stats.evicted(len(room.evicted))
            self.unlink_later([k for k, _ in room.evicted])
        todo = []
        for i, verdict in enumerate(room.verdicts):
            if verdict is Verdict.RESERVED:
                todo.append(i)
            elif verdict is Verdict.PRESENT:
                job.succeed(i)
            else:  # only pinned entries or this job's own are left
                job.fail(i, FailureReason.FULL)
        return todo

    async def _store(self, job: Job, i: int) -> Outcome:
        plan: _Stored = job.state
        value = await self.off_loop(self._encode, job, i)
        name = self.names.block(job.keys[i])
        if self.ttl_ms:
            # Taken before the SET: the index's expiry is never later than Redis's.
            expires = wall_ms() + self.ttl_ms
            done = await self.request(job, "store", self.client.set(name, value, px=self.ttl_ms))
        else:
            expires = 0
            done = await self.request(job, "store", self.client.set(name, value))
        if isinstance(done, FailureReason):
            return done
        plan.written[i] = expires
        return None

    def _encode(self, job: Job, i: int) -> bytes:
        return record.encode(self.fingerprint, job.keys[i], self.ctx.pool.block(job.slots[i]))

    def _end_store(self, job: Job) -> None:
        """What was SET becomes visible to lookup (only now: a HIT is always readable)."""
        plan: _Stored | None = job.state
        if plan is None:  # never started: timeout or closed
            return
        with plan.room as room:
            # In the job's order, whatever order the SETs ended in: a prefix's first
            # blocks are the older ones.
            for i, expires in sorted(plan.written.items()):
                if job.succeeded(i):
                    room.commit(job.keys[i], expires)
