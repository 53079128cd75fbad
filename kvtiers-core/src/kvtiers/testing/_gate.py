"""`GatedPool`: a pool view that lets a test freeze a tier's I/O in the middle of a job.

A tier reaches slot bytes through `PoolView.block(slot)` on its own threads. A
`GatedPool` hands out `Gate`s over chosen slots: while a gate is closed, every
`block()` of one of its slots made by any thread other than the test's (the thread
that built the pool) waits at the gate, until the test calls `release()`. So a test
can hold a store after it started copying, or a load before it wrote its slot, and
look at the tier meanwhile (what `lookup` answers, what `get_finished_jobs`
reports, whether another job may evict the block) without sleeping: `wait_entered`
returns as soon as a tier thread is held.

The test's own thread is never held, so `fill_slots`, `poison_slots` and the
checks of a test read and write the pool as usual. A held thread gives up after
`hold_s` real seconds and goes on (the gate records `expired`), so a test that
forgets to release, or a tier that waits for the test while the test waits for
it, fails instead of hanging.

`fail(slots)` makes `block()` of those slots raise `OSError(EIO)` on tier threads,
as a slot whose memory cannot be reached would: the tier must fail that key, and
only it, never the engine.
"""

from __future__ import annotations

import errno
import mmap
import threading
from collections.abc import Iterable
from types import TracebackType

from kvtiers.contract.pool_view import ALIGN, PoolView, round_up

#: Real seconds a held tier thread waits for the test before it goes on by itself.
DEFAULT_HOLD_S = 30.0


class Gate:
    """A closed gate over some slots of a `GatedPool` (see the module doc). Use as a
    context manager to release it however the block ends."""

    def __init__(self, slots: Iterable[int], hold_s: float):
        self.slots = frozenset(slots)
        self.hold_s = hold_s
        self._open = threading.Event()
        self._entered = threading.Event()
        self._lock = threading.Lock()
        self._held = 0
        self._expired = False
        self.entered_slots: set[int] = set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def entered(self) -> bool:
        """A tier thread reached one of the gate's slots (it may have gone on since)."""
        return self._entered.is_set()

    @property
    def held(self) -> int:
        """Tier threads waiting at the gate now."""
        with self._lock:
            return self._held

    @property
    def expired(self) -> bool:
        """A held thread gave up waiting (`hold_s` passed before `release`)."""
        with self._lock:
            return self._expired

    def wait_entered(self, timeout_s: float, what: str = "") -> None:
        """Block until a tier thread is held at the gate; AssertionError after
        `timeout_s` real seconds (the tier never reached these slots from its own
        threads: it copies elsewhere, or not at all)."""
        if not self._entered.wait(timeout_s):
            raise AssertionError(
                f"{what or 'the tier'} never reached slot(s) {sorted(self.slots)} through "
                f"PoolView.block() on its own threads within {timeout_s}s (a tier that "
                "reaches slot bytes otherwise sets gated_pool = False in its test class)"
            )

    def release(self) -> None:
        """Let held threads (and later ones) through. Idempotent."""
        self._open.set()

    def _hold(self, slot: int) -> None:
        with self._lock:
            self._held += 1
            self.entered_slots.add(slot)
        self._entered.set()
        released = self._open.wait(self.hold_s)
        with self._lock:
            self._held -= 1
            if not released:
                self._expired = True

    def __enter__(self) -> Gate:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class GatedPool(PoolView):
    """An anonymous pool whose `block()` can hold tier threads at `Gate`s, or fail.

    Build it on the test's thread: that thread is never held nor failed.
    """

    def __init__(self, num_slots: int, block_bytes: int, *, hold_s: float = DEFAULT_HOLD_S):
        size = max(num_slots * round_up(block_bytes), ALIGN)
        super().__init__(mmap.mmap(-1, size), block_bytes)
        self.hold_s = hold_s
        self.owner = threading.get_ident()
        self._lock = threading.Lock()
        self._gates: list[Gate] = []
        self._failing: set[int] = set()
        self.accessed: set[int] = set()  # slots tier threads reached, gated or not

    def gate(self, slots: Iterable[int]) -> Gate:
        """A new closed gate over `slots` (each slot in at most one closed gate)."""
        gate = Gate(slots, self.hold_s)
        for slot in gate.slots:
            if not 0 <= slot < self.num_slots:
                raise IndexError(f"slot {slot} out of range 0..{self.num_slots - 1}")
        with self._lock:
            self._gates = [g for g in self._gates if not g.is_open]
            taken = {s for g in self._gates for s in g.slots} & gate.slots
            if taken:
                raise ValueError(f"slots {sorted(taken)} are behind another closed gate")
            self._gates.append(gate)
        return gate

    def release_all(self) -> None:
        """Open every gate and stop every failure (the end of a test)."""
        with self._lock:
            gates, self._gates = self._gates, []
            self._failing.clear()
        for gate in gates:
            gate.release()

    def fail(self, slots: Iterable[int]) -> None:
        """From now on `block()` of `slots` raises `OSError(EIO)` on tier threads."""
        with self._lock:
            self._failing.update(slots)

    def mend(self) -> None:
        """Stop every failure set by `fail`."""
        with self._lock:
            self._failing.clear()

    def block(self, slot: int) -> memoryview:
        if threading.get_ident() != self.owner:
            with self._lock:
                self.accessed.add(slot)
                failing = slot in self._failing
                gate = next((g for g in self._gates if slot in g.slots and not g.is_open),
                            None)
            if gate is not None:
                gate._hold(slot)
            if failing:
                raise OSError(errno.EIO, f"slot {slot} cannot be reached (GatedPool.fail)")
        return super().block(slot)
