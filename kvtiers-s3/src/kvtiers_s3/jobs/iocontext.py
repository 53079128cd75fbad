"""`IoContext`: what every request of one tier's jobs needs - the object store, the
copier threads, a request's time limit, each request's latency, and the background
deletes of objects that left the index, the verdicts on objects that failed
verification. Shared by `stores.Stores` and `loads.Loads`.

Threads: built on the scheduler thread (the tier's constructor); `attach` once the
loop's store exists; everything else runs on the tier's event loop, except
`off_loop`'s function, which runs on a copier thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kvtiers.sdk import (
    ErrorCounts,
    FailureReason,
    Job,
    StatsRecorder,
    TierContext,
    run_off_loop,
    take_back,
)

from kvtiers_s3.client.objects import ObjectStore
from kvtiers_s3.holdings.index import Holdings, StoredObject
from kvtiers_s3.holdings.verdicts import Verdicts
from kvtiers_s3.jobs.latency import RequestLatency
from kvtiers_s3.settings import S3Settings

__all__ = ["IoContext", "engine_failure"]

T = TypeVar("T")


class IoContext:
    """`spawn(coro)` runs a background coroutine on the loop (deletes), tracked by
    the tier; it is called on the loop thread only."""

    store: ObjectStore  # set by `attach`, once the tier's loop exists

    def __init__(self, ctx: TierContext, settings: S3Settings, holdings: Holdings,
                 ns_root: str, stats: StatsRecorder, errors: ErrorCounts,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]):
        self.ctx = ctx
        self.settings = settings
        self.holdings = holdings
        self.ns_root = ns_root
        self.fingerprint = ctx.namespace.fingerprint
        self.block_bytes = ctx.block_bytes
        self.stats = stats
        self.errors = errors
        self.spawn = spawn
        #: names of objects being deleted -> set once that delete returns (the loop's)
        self.deleting: dict[str, asyncio.Event] = {}
        #: objects that failed verification, left out until they change (the loop's)
        self.verdicts = Verdicts()
        #: each GET's and PUT's time (recorded on the loop thread)
        self.latency = RequestLatency()
        # Slot copies and checksums run here, off the loop: a pool access may be slow
        # (a page fault, a test's gate), and the loop must keep serving other requests.
        self.copier = ThreadPoolExecutor(max(1, min(4, settings.concurrency)),
                                         thread_name_prefix=f"kvtiers-{ctx.name or 's3'}-copy")

    def attach(self, store: ObjectStore) -> None:
        self.store = store

    def timeout(self, job: Job) -> float:
        """How long one request of `job` may take: `timeout_s`, or less where the
        job's deadline is nearer."""
        limit = self.settings.timeout_s
        deadline = job.transfer.deadline
        if deadline is not None:
            limit = min(limit, max(1e-3, deadline - self.ctx.clock()))
        return limit

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a copier thread (`kvtiers.sdk.run_off_loop`)."""
        return await run_off_loop(self.copier, fn, *args)

    def delete_later(self, objects: Sequence[StoredObject]) -> None:
        """Delete objects in the background (on the loop thread)."""
        if objects:
            self.delete_names([o.name for o in objects])

    def delete_names(self, names: list[str]) -> None:
        # Until the delete returns, a probe or listing that still finds these objects
        # must not take them back in (they would evict live blocks for dead ones),
        # and a store of the same name waits (`deleted`): a delete that lands after
        # its PUT would take the new object.
        if not names:
            return
        done = asyncio.Event()
        for name in names:
            self.deleting[name] = done
        self.spawn(self._delete(names, done))

    def retract(self, name: str) -> None:
        """Take back the object of a PUT reported failed whose request may still
        land: one the server holds in its buffers (it was frozen, or slow past the
        job's deadline) is written whenever the server runs again, uncounted - the
        key was reported not stored. Until the PUT is provably undone the name is
        as good as gone (`deleting`: no probe or listing takes it in, a store of it
        waits): deleted until the server answers a delete, then - the requests it
        held are handled as it runs again - once more a second later
        (`kvtiers.sdk.take_back`).
        Call once the PUT's own request has ended (its thread, its connection)."""
        done = asyncio.Event()
        self.deleting[name] = done
        self.spawn(self._retract(name, done))

    async def _retract(self, name: str, done: asyncio.Event) -> None:
        try:
            await take_back(lambda: self.store.delete([name]), self.errors)
        finally:
            if self.deleting.get(name) is done:
                del self.deleting[name]
            done.set()

    async def deleted(self, name: str) -> None:
        """Wait until no delete of `name` is in flight."""
        while (done := self.deleting.get(name)) is not None:
            await done.wait()

    async def _delete(self, names: list[str], done: asyncio.Event) -> None:
        try:
            await asyncio.wait_for(self.store.delete(names), self.settings.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a failed delete leaves an orphan, no more
            self.errors.record("delete", exc)
        finally:
            for name in names:
                if self.deleting.get(name) is done:
                    del self.deleting[name]
            done.set()


def engine_failure(job: Job) -> FailureReason:
    """Why a request the engine never ran (or cut short) failed, for its other keys."""
    return FailureReason.TIMEOUT if job.expired() else FailureReason.CLOSED
