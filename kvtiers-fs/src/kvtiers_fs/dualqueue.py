"""`DualQueueThreadPool`: loads and stores in separate queues, each with its own
threads; a thread whose own queue is empty takes work from the other one.

Why not `kvtiers.tiers.JobWorkers`: it runs whole jobs on one shared set of threads
(loads first). The fs tier needs (a) tasks of one block each, so that one large job
spreads over every thread and a load never waits for more than one block of a store
to finish, and (b) thread counts per kind, as vLLM configures them
(`n_read_threads`, `n_write_threads`).

Scheduling, per free thread: a load thread takes the oldest queued load, else the
oldest queued store; a store thread takes the oldest store, else the oldest load.
So a load submitted behind a thousand queued stores starts as soon as any load
thread finishes the one block it is on, and idle threads of either kind help the
other. Tasks are plain objects with `run()` and `cancel()`; the pool calls `run` on
a worker thread and, for tasks still queued at `close`, hands them back unrun so
that the owner can `cancel` them (report `closed`).

Every method may be called from any thread and never blocks on I/O; `run` never
runs under the pool's lock.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable
from typing import Protocol

LOAD = "load"
STORE = "store"


class Task(Protocol):
    def run(self) -> None: ...

    def cancel(self) -> None: ...


class DualQueueThreadPool:
    def __init__(self, load_threads: int, store_threads: int, *, name: str = "kvtiers-fs",
                 logger: logging.Logger | None = None):
        if load_threads < 1 or store_threads < 1:
            raise ValueError(
                f"thread counts must be >= 1, got load={load_threads} store={store_threads}"
            )
        self._log = logger or logging.getLogger("kvtiers.fs")
        self._cond = threading.Condition()
        self._queues: dict[str, deque[Task]] = {LOAD: deque(), STORE: deque()}
        self._closed = False
        self._running = 0
        #: tasks run, by (thread kind, task kind): ("load", "store") counts steals
        self.ran: dict[tuple[str, str], int] = {
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

    def submit(self, kind: str, tasks: Iterable[Task], *, first: bool = False) -> bool:
        """Queue `tasks` (in order) on the `kind` queue - at its head when `first`
        (work that continues a job already started, such as a store job's block
        writes after its reservation, goes before jobs not started yet). False
        (nothing queued) after `close`: the caller cancels them."""
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

    def queued(self, kind: str | None = None) -> int:
        with self._cond:
            if kind is None:
                return sum(len(q) for q in self._queues.values())
            return len(self._queues[kind])

    def close(self, timeout: float | None = None) -> list[Task]:
        """Stop taking tasks, wait for running ones, stop the threads. Returns the
        tasks that were still queued (never run), loads first. Idempotent."""
        with self._cond:
            left = [*self._queues[LOAD], *self._queues[STORE]]
            for q in self._queues.values():
                q.clear()
            self._closed = True
            self._cond.notify_all()
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout)
        return left

    def _next(self, kind: str) -> tuple[str, Task] | None:
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

    def _work(self, kind: str) -> None:
        while True:
            with self._cond:
                picked = self._next(kind)
                if picked is None:
                    return
                self._running += 1
            task_kind, task = picked
            try:
                task.run()
            except BaseException:  # noqa: BLE001 - a task bug must not kill the thread
                self._log.exception("kvtiers-fs task %r crashed", task)
            finally:
                with self._cond:
                    self._running -= 1
                    self.ran[(kind, task_kind)] += 1
