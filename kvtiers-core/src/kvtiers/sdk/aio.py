"""`AsyncJobEngine`: the job engine for tiers whose client is asyncio (s3fs,
aiobotocore, pyzmq's asyncio sockets): work items are coroutines, run on one
event-loop thread that the engine owns, with bounded concurrency.

The promises are `kvtiers.sdk.engine.JobEngine`'s: per-block items grouped into
units of up to `batch_bytes`, exactly-once results reported only once no item of
the job can still touch its slots, deadlines on the tier's clock checked when a
unit is taken, `closed` for queued units at close and for jobs submitted after,
`io` for the keys of an item that raised (logged), start and end hooks.

Concurrency is bounded like the thread pool's threads: `load_concurrency` units may
run at once in load places and `store_concurrency` in store places; a free load
place takes the oldest queued load, else the oldest store, and a store place the
other way round, so loads go ahead of stores and idle places help the other kind.
A store's items, once its start hook ran, go to the head of the store queue.

Threads:
- `submit_*`, `take_finished`, `closed`, `pending`: the scheduler thread; never
  block (a hand-off to the loop with `call_soon_threadsafe`).
- `block` and `batch` coroutines run on the loop thread; so do the start and end
  hooks, which are plain functions and must not block (an end hook also runs on the
  thread of `submit_*` for a job refused after close, and on the loop at close).
- `run(coro)` lets tier code run set-up and tear-down coroutines on the loop from
  another thread (open a client in the constructor); `on_close` runs last, on the
  loop, after every item (close sessions there).
- `close` cancels what is queued (`closed`), waits for running items up to
  `timeout`, then cancels them (their keys fail with `closed` once they have
  unwound) and stops the loop. Items must let cancellation through.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvtiers.contract.jobs import FailureReason, TransferJob
from kvtiers.contract.stats import StatsRecorder
from kvtiers.contract.tier import TierContext
from kvtiers.sdk.dualqueue import LOAD, STORE, Kind
from kvtiers.sdk.engine_front import EngineFront
from kvtiers.sdk.job import CrashHook, EndHook, Job, Outcome, StartHook

__all__ = ["AsyncBatchFn", "AsyncBlockFn", "AsyncJobEngine", "AsyncJobHooks", "run_off_loop"]

T = TypeVar("T")


async def run_off_loop(executor: concurrent.futures.Executor, fn: Callable[..., T],
                       *args: Any) -> T:
    """`fn(*args)` on `executor` (a tier's copier threads: slot copies and checksums
    off the event loop). Cancelled (the tier closing), it still waits for the thread
    to finish before the cancellation goes on: a job's slots must be untouched once
    the job is reported."""
    fut = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        if not fut.cancelled():
            fut.exception()  # read: the cancellation wins, nothing is logged unread
        raise

#: `block(job, i)`: a coroutine doing the I/O of key `i`; None when it succeeded
AsyncBlockFn = Callable[[Job, int], Awaitable[Outcome]]
#: `batch(job, indices)`: a coroutine doing the I/O of several consecutive keys
AsyncBatchFn = Callable[[Job, Sequence[int]], Awaitable[Sequence[Outcome]]]


@dataclass(frozen=True, slots=True)
class AsyncJobHooks:
    """`JobHooks` with coroutine work: `block` (required) and `batch` are `async
    def`s; `start` and `end` are plain functions, called on the loop thread, that
    must not block (dictionary work: reserve room, commit, unpin)."""

    block: AsyncBlockFn
    batch: AsyncBatchFn | None = None
    start: StartHook | None = None
    end: EndHook | None = None


@dataclass(slots=True)
class _Unit:
    job: Job
    kind: Kind
    indices: Sequence[int] | None  # None: the job's start hook


class AsyncJobEngine(EngineFront[AsyncJobHooks]):
    """One tier's jobs on an event loop of its own (a daemon thread). Defaults: no
    batching (each item is a unit: an object store has no use for grouping), 8 load
    and 8 store places."""

    def __init__(
        self,
        ctx: TierContext,
        *,
        load: AsyncJobHooks,
        store: AsyncJobHooks,
        load_concurrency: int = 8,
        store_concurrency: int = 8,
        stats: StatsRecorder | None = None,
        batch_bytes: int = 0,
        block_bytes: int | None = None,
        on_crash: CrashHook | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
        name: str | None = None,
    ):
        if load_concurrency < 0 or store_concurrency < 0 or (
                load_concurrency + store_concurrency < 1):
            raise ValueError(
                "concurrency must be >= 0 per kind and >= 1 in all, got "
                f"load={load_concurrency} store={store_concurrency}")
        super().__init__(ctx, load=load, store=store, stats=stats, batch_bytes=batch_bytes,
                         block_bytes=block_bytes, on_crash=on_crash, name=name)
        self._log = ctx.logger
        self._on_close = on_close
        # Loop-thread state.
        self._caps: dict[Kind, int] = {LOAD: load_concurrency, STORE: store_concurrency}
        self._running: dict[Kind, int] = {LOAD: 0, STORE: 0}
        self._queues: dict[Kind, deque[_Unit]] = {LOAD: deque(), STORE: deque()}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        #: units run, by (place kind, unit kind): ("load", "store") counts steals
        self.ran: dict[tuple[Kind, Kind], int] = {
            (a, b): 0 for a in (LOAD, STORE) for b in (LOAD, STORE)}
        self._close_lock = threading.Lock()
        self._clean: bool | None = None  # close's verdict, once closed
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The engine's loop: create asyncio clients on it (`run`), not on another."""
        return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (blocks; not from the loop
        thread, not after close). For a tier's set-up and tear-down."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("AsyncJobEngine.run called from its own loop: await instead")
        if self._clean is not None:
            coro.close()
            raise RuntimeError("AsyncJobEngine.run after close")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # Any thread (not the loop's); blocks. (The scheduler's calls: `EngineFront`.)

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new jobs, fail queued units with `closed`, wait up to `timeout` for
        running items, cancel those still running, run `on_close`, stop the loop.
        Idempotent. False when items had to be cancelled, or ignored it."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("AsyncJobEngine.close called from its own loop")
        with self._close_lock:
            if self._clean is not None:
                return self._clean
            self._ledger.close()  # from here on, nothing new reaches the loop
            future = asyncio.run_coroutine_threadsafe(self._shutdown(timeout), self._loop)
            try:
                clean = future.result()
            except concurrent.futures.CancelledError:
                clean = False
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._clean = clean
            return clean

    # The loop thread.

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()

    def _submit(self, transfer: TransferJob, kind: Kind, state: Any) -> None:
        job = Job(transfer, kind == LOAD, state, self._clock)

        def hand_over() -> None:
            self._loop.call_soon_threadsafe(self._arrive, job, kind)

        if not self._ledger.admit(hand_over):
            job._settle_rest(FailureReason.CLOSED)
            self._flow.end(job, self._hooks[kind].end, counted=False)

    def _arrive(self, job: Job, kind: Kind) -> None:
        if self._closing:
            job._settle_rest(FailureReason.CLOSED)
            self._flow.end(job, self._hooks[kind].end)
        elif not job.keys:
            self._flow.end(job, self._hooks[kind].end)
        elif self._hooks[kind].start is not None:
            job._add_units(1)
            self._queues[kind].append(_Unit(job, kind, None))
        else:
            self._queue_items(job, kind, range(len(job.keys)), first=False)
        self._pump()

    def _queue_items(self, job: Job, kind: Kind, indices: Sequence[int], first: bool) -> None:
        units = [_Unit(job, kind, u) for u in self._flow.units(indices)]
        job._add_units(len(units))
        if self._closing:
            for unit in units:
                self._cancel(unit)
        elif first:
            self._queues[kind].extendleft(reversed(units))
        else:
            self._queues[kind].extend(units)

    def _pump(self) -> None:
        """Start queued units while places are free."""
        if self._closing:
            return
        queues, running, caps = self._queues, self._running, self._caps
        for place, other in ((LOAD, STORE), (STORE, LOAD)):
            while running[place] < caps[place]:
                q = queues[place] or queues[other]
                if not q:
                    break
                unit = q.popleft()
                running[place] += 1
                self.ran[(place, unit.kind)] += 1
                task = self._loop.create_task(self._run(place, unit))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _run(self, place: Kind, unit: _Unit) -> None:
        try:
            await self._execute(unit)
        except BaseException:  # noqa: BLE001 - an engine bug must not stop the loop
            self._log.exception("kvtiers.sdk.aio: unit of job %d failed", unit.job.job_id)
        finally:
            self._running[place] -= 1
            self._pump()

    async def _execute(self, unit: _Unit) -> None:
        job, kind, indices = unit.job, unit.kind, unit.indices
        hooks = self._hooks[kind]
        job._begin()
        if indices is None:
            assert hooks.start is not None
            if job.expired():
                job._settle_rest(FailureReason.TIMEOUT)
            else:
                items = self._flow.start(job, hooks.start)
                if items:
                    self._queue_items(job, kind, items, first=True)
            self._retire(job, kind, (), (), 1)
            return
        outcomes: list[Outcome] = []
        try:
            if job.expired():
                outcomes = [FailureReason.TIMEOUT] * len(indices)
            elif hooks.batch is not None and self._flow.per_unit > 1:
                outcomes = await self._batch(job, hooks.batch, indices)
            else:
                for i in indices:
                    outcomes.append(await self._block(job, hooks.block, i))
        except asyncio.CancelledError:  # close ran out of time: the item has unwound
            outcomes += [FailureReason.CLOSED] * (len(indices) - len(outcomes))
        self._retire(job, kind, indices, outcomes, 1)

    async def _block(self, job: Job, block: AsyncBlockFn, i: int) -> Outcome:
        if job.expired():
            return FailureReason.TIMEOUT
        try:
            return await block(job, i)
        except Exception as exc:  # noqa: BLE001 - a tier bug costs misses, not the engine
            self._flow.crashed(job, f"the work item of key {i}", exc)
            return FailureReason.IO

    async def _batch(self, job: Job, batch: AsyncBatchFn,
                     indices: Sequence[int]) -> list[Outcome]:
        try:
            outcomes = list(await batch(job, indices))
        except Exception as exc:  # noqa: BLE001 - a tier bug costs misses, not the engine
            self._flow.crashed(job, f"a batch of {len(indices)} items", exc)
            return [FailureReason.IO] * len(indices)
        if len(outcomes) != len(indices):
            self._flow.crashed(job, "a batch", ValueError(
                f"batch returned {len(outcomes)} outcomes for {len(indices)} items"))
            return [FailureReason.IO] * len(indices)
        return outcomes

    def _retire(self, job: Job, kind: Kind, indices: Sequence[int],
                outcomes: Sequence[Outcome], units: int) -> None:
        if job._settle(indices, outcomes, self._flow.block_bytes, units):
            self._flow.end(job, self._hooks[kind].end)

    def _cancel(self, unit: _Unit) -> None:
        if unit.indices is None:
            unit.job._settle_rest(FailureReason.CLOSED)
            self._retire(unit.job, unit.kind, (), (), 1)
        else:
            n = len(unit.indices)
            self._retire(unit.job, unit.kind, unit.indices, [FailureReason.CLOSED] * n, 1)

    async def _shutdown(self, timeout: float | None) -> bool:
        self._closing = True
        for q in self._queues.values():
            while q:
                self._cancel(q.popleft())
        clean = True
        running = set(self._tasks)
        if running:
            _, late = await asyncio.wait(running, timeout=timeout)
            if late:
                clean = False
                for task in late:
                    task.cancel()
                _, stuck = await asyncio.wait(late, timeout=timeout)
                if stuck:
                    self._log.error("kvtiers.sdk.aio: %d item(s) ignored cancellation at "
                                    "close; their jobs are never reported", len(stuck))
        if self._on_close is not None:
            try:
                await self._on_close()
            except Exception:  # noqa: BLE001 - closing must not raise
                self._log.exception("kvtiers.sdk.aio: on_close raised")
        return clean
