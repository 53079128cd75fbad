"""`IntentWaits`: store jobs waiting for another writer's write of the same block.

A block being written by another intent (another process, or another job of this
one) is not stored until that intent commits: a store reports success only for a
complete copy committed in the journal. So a store job whose reservation says
`PENDING` registers a wait here and its I/O thread moves on. One thread per store,
started at the first wait, polls for all of them: it reads the journal's new frames
(`sync`; a few syscalls), then for each block:

- committed (by the other writer, or found complete when a dead writer's intents
  were settled): `PRESENT`;
- no longer pending and not committed (the other write failed, or its writer died
  without a complete file): it reserves the block for the waiting job (`GRANTED` /
  `RECYCLED`: the job writes it itself; `FULL`; or `PENDING` again if a third writer
  took it first - then it keeps waiting);
- still pending: if its writer died, the dead writer's intents are settled now
  (under the namespace lock); past the job's deadline (or `MAX_WAIT_S` for a job
  without one): `TIMEOUT`. A writer that is stopped (SIGSTOP) is alive: its blocks
  are never reported stored by anyone else before it resumes or dies.

`done(verdict)` is called exactly once per wait, from the wait thread (or from
`close`, with `CLOSED`), holding no lock. The namespace lock is never held while
waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from kvtiers.sdk import Clock

from kvtiers_fs.disk.layout import Ident
from kvtiers_fs.namespace.write_verdict import WriteVerdict

#: seconds between looks at the journal while waits exist (doubling up to MAX_POLL_S)
POLL_S = 0.001
MAX_POLL_S = 0.02
#: seconds between checks that a pending intent's writer is still alive
DEAD_CHECK_S = 0.1
#: the longest wait of a job that has no deadline (real seconds)
MAX_WAIT_S = 60.0

COMMITTED, PENDING, ABSENT = "committed", "pending", "absent"


class WaitHost(Protocol):
    """What the waits need from their store (`RootStore`)."""

    writer: int

    def sync(self) -> None: ...

    def intent_state(self, idn: Ident) -> tuple[str, int]: ...

    def reserve(self, items: list[tuple[Ident, int]]) -> tuple[list[WriteVerdict], int]: ...

    def settle_if_dead(self, writer: int) -> None: ...


class _Wait:
    __slots__ = ("idn", "size", "deadline", "clock", "done", "started", "state")

    def __init__(self, idn: Ident, size: int, deadline: float | None, clock: Clock,
                 done: Callable[[WriteVerdict], None]):
        self.idn, self.size, self.deadline, self.clock, self.done = (
            idn, size, deadline, clock, done)
        self.started = time.monotonic()
        self.state = "waiting"  # -> "busy" (reserving) -> "done"

    def expired(self) -> bool:
        if self.deadline is not None and self.clock() > self.deadline:
            return True
        return time.monotonic() - self.started > MAX_WAIT_S


class IntentWaits:
    def __init__(self, host: WaitHost, errors: Callable[[str, BaseException], None]):
        self._host = host
        self._errors = errors
        self._cv = threading.Condition()
        self._waits: list[_Wait] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._woken = False
        self._dead_checked: dict[int, float] = {}

    def add(self, idn: Ident, size: int, deadline: float | None, clock: Clock,
            done: Callable[[WriteVerdict], None]) -> None:
        """Wait for the intent pending on `idn` to end (see the module doc). Never
        blocks; `done` may be called before this returns (from the wait thread)."""
        wait = _Wait(idn, size, deadline, clock, done)
        with self._cv:
            if not self._closed:
                self._waits.append(wait)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name="kvtiers-fs-waits")
                    self._thread.start()
                self._cv.notify()
                return
        self._fire(wait, WriteVerdict.CLOSED)

    def __len__(self) -> int:
        with self._cv:
            return len(self._waits)

    def wake(self) -> None:
        """An intent of this process ended: look again now."""
        with self._cv:
            if self._waits:
                self._woken = True
                self._cv.notify()

    def close(self) -> None:
        """End every wait with `CLOSED` (a wait being resolved ends with its own
        verdict) and stop the thread."""
        with self._cv:
            self._closed = True
            waits, self._waits = self._waits, []
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        for wait in waits:
            self._fire(wait, WriteVerdict.CLOSED)

    def _fire(self, wait: _Wait, verdict: WriteVerdict, *, claimed: bool = False) -> None:
        with self._cv:
            if wait.state == "done" or (wait.state == "busy" and not claimed):
                return
            wait.state = "done"
            if wait in self._waits:
                self._waits.remove(wait)
        try:
            wait.done(verdict)
        except Exception as exc:  # noqa: BLE001 - one job's callback must not stop the others
            self._errors("wait", exc)

    def _run(self) -> None:
        delay = POLL_S
        while True:
            with self._cv:
                while not self._closed and not self._waits:
                    self._cv.wait()
                    delay = POLL_S
                if self._closed:
                    return
                if not self._woken:
                    self._cv.wait(delay)
                self._woken = False
                if self._closed:
                    return
                batch = [w for w in self._waits if w.state == "waiting"]
            delay = min(delay * 2, MAX_POLL_S)
            try:
                self._host.sync()
            except OSError as exc:
                self._errors("wait", exc)
            for wait in batch:
                try:
                    self._check(wait)
                except Exception as exc:  # noqa: BLE001 - a bug ends the wait, not the thread
                    self._errors("wait", exc)
                    self._fire(wait, WriteVerdict.ERROR)

    def _check(self, wait: _Wait) -> None:
        state, writer = self._host.intent_state(wait.idn)
        if state == COMMITTED:
            self._fire(wait, WriteVerdict.PRESENT)
            return
        if wait.expired():
            self._fire(wait, WriteVerdict.TIMEOUT)
            return
        if state == PENDING:
            if writer != self._host.writer:
                now = time.monotonic()
                if now - self._dead_checked.get(writer, 0.0) > DEAD_CHECK_S:
                    self._dead_checked[writer] = now
                    self._host.settle_if_dead(writer)
            return
        # Ended without a copy: write it ourselves. Claimed first, so that a close
        # meanwhile cannot end the wait while we take an intent for it.
        with self._cv:
            if wait.state != "waiting":
                return
            wait.state = "busy"
        try:
            verdict = self._host.reserve([(wait.idn, wait.size)])[0][0]
        except OSError as exc:
            self._errors("wait", exc)
            verdict = WriteVerdict.ERROR
        if verdict is WriteVerdict.PENDING:
            with self._cv:
                if not self._closed:
                    wait.state = "waiting"  # a third writer took it: keep waiting
                    return
            verdict = WriteVerdict.CLOSED
        self._fire(wait, verdict, claimed=True)
