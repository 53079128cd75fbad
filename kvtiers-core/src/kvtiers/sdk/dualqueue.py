"""`DualQueueThreadPool`: loads and stores in separate queues, each with its own
threads; a thread whose own queue is empty takes work from the other one.

Scheduling, per free thread: a load thread takes the oldest queued load, else the
oldest queued store; a store thread takes the oldest store, else the oldest load.
So a load submitted behind a thousand queued stores starts as soon as any load
thread finishes the task it is on, and idle threads of either kind help the other.
A pool with no store threads is one set of threads that always prefers loads.

Tasks are plain objects with `run()` and `cancel()`; the pool calls `run` on a
worker thread and, for tasks still queued at `close`, hands them back unrun so that
the owner can `cancel` them (report `closed`). The job engine
(`kvtiers.sdk.engine.JobEngine`) is the usual owner; a tier may use the pool alone.

Every method may be called from any thread and never blocks on I/O; `run` never
runs under the pool's lock.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable
from typing import Literal, Protocol

__all__ = ["LOAD", "STORE", "DualQueueThreadPool", "Kind", "Task"]

Kind = Literal["load", "store"]
LOAD: Kind = "load"
STORE: Kind = "store"


class Task(Protocol):
    def run(self) -> None:
        """Called once, on a worker thread. Exceptions are logged, never raised."""

    def cancel(self) -> None:
        """Called by the pool's owner for a task `close` handed back unrun."""


class DualQueueThreadPool:
    """`load_threads` + `store_threads` daemon threads (at least one in all; either
    count may be 0). `ran[(thread kind, task kind)]` counts tasks run: a load thread
    running a store is a steal."""

    def __init__(self, load_threads: int, store_threads: int, *, name: str = "kvtiers",
                 logger: logging.Logger | None = None):
        if load_threads < 0 or store_threads < 0 or load_threads + store_threads < 1:
            raise ValueError(
                "thread counts must be >= 0 and >= 1 in all, got "
                f"load={load_threads} store={store_threads}"
            )
        self._log = logger or logging.getLogger("kvtiers.sdk")
        self._cond = threading.Condition()
        self._queues: dict[Kind, deque[Task]] = {LOAD: deque(), STORE: deque()}
        self._closed = False
        self.ran: dict[tuple[Kind, Kind], int] = {
            (a, b): 0 for a in (LOAD, STORE) for b in (LOAD, STORE)
        }
        self._threads = [
            threading.Thread(target=self._work, args=(kind,), name=f"{name}-{kind}-{i}",
                             daemon=True)
            for kind, n in ((LOAD, load_threads), (STORE, store_threads))
            for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def submit(self, kind: Kind, tasks: Iterable[Task], *, first: bool = False) -> bool:
        """Queue `tasks` (in order) on the `kind` queue - at its head when `first`
        (work that continues a job already started goes before jobs not started
        yet). False (nothing queued) after `close`: the caller cancels them."""
        tasks = list(tasks)
        with self._cond:
            if self._closed:
                return False
            if first:
                self._queues[kind].extendleft(reversed(tasks))
            else:
                self._queues[kind].extend(tasks)
            self._cond.notify(len(tasks))
        return True

    def queued(self, kind: Kind | None = None) -> int:
        with self._cond:
            if kind is None:
                return sum(len(q) for q in self._queues.values())
            return len(self._queues[kind])

    @property
    def closed(self) -> bool:
        return self._closed

    def alive(self) -> bool:
        """Whether a worker thread is still running (after `close`: still in a task)."""
        return any(t.is_alive() for t in self._threads)

    def close(self, timeout: float | None = None) -> list[Task]:
        """`stop`, then `join`: returns the tasks that were still queued (never
        run), loads first, once running ones have finished. Idempotent."""
        left = self.stop()
        self.join(timeout)
        return left

    def stop(self) -> list[Task]:
        """Stop taking tasks (later `submit`s return False) and hand back the queued
        ones, loads first, without waiting for running ones. Idempotent."""
        with self._cond:
            left = [*self._queues[LOAD], *self._queues[STORE]]
            for q in self._queues.values():
                q.clear()
            self._closed = True
            self._cond.notify_all()
        return left

    def join(self, timeout: float | None = None) -> None:
        """Wait (up to `timeout` per thread) for the threads to end after `stop`; a
        worker thread may call it (it skips itself)."""
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout)

    def _next(self, kind: Kind) -> tuple[Kind, Task] | None:
        """Holds the lock. The next task for a thread of `kind`, None when closed."""
        own, other = (LOAD, STORE) if kind == LOAD else (STORE, LOAD)
        while True:
            for k in (own, other):
                q = self._queues[k]
                if q:
                    return k, q.popleft()
            if self._closed:
                return None
            self._cond.wait()

    def _work(self, kind: Kind) -> None:
        while True:
            with self._cond:
                picked = self._next(kind)
            if picked is None:
                return
            task_kind, task = picked
            try:
                task.run()
            except BaseException:  # noqa: BLE001 - a task bug must not kill the thread
                self._log.exception("task %r crashed", task)
            with self._cond:
                self.ran[(kind, task_kind)] += 1
