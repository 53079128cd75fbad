"""Promotions a `KvtiersTier` reported failed past their deadline while its kvtiers
tier still runs them (vLLM 0.34's deferred release).

A promotion is tracked from submission with its deadline. Past it, `expire` hands
out an event per late job: vLLM fails the job's keys at once and keeps its CPU
chunks held until the event is set. The event is set when the kvtiers tier reports
the job (`finished`: its I/O can no longer touch the chunks) or when every job of
the tier has ended (`release_all`, after a drain or a close). While a late job runs,
its keys are `late`: the tier answers them as misses, so that the request recomputes
instead of promoting the same blocks again into more held chunks.

Scheduler thread (under vLLM's manager lock); nothing blocks. Events may be read
from any thread (vLLM polls them on its own path).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


class LatePromotions:
    """See the module docstring. `clock` is the kvtiers tier's clock (seconds)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._due: dict[int, tuple[float, Sequence[bytes]]] = {}  # job -> deadline, keys
        self._late: dict[int, tuple[threading.Event, Sequence[bytes]]] = {}
        self._late_keys: dict[bytes, int] = {}  # key -> late jobs that still read it

    def track(self, job_id: int, deadline: float, keys: Sequence[bytes]) -> None:
        self._due[job_id] = (deadline, keys)

    def finished(self, job_id: int) -> bool:
        """The kvtiers tier reported `job_id`. True when it was reported to vLLM as
        late already: its event is set now, and this result is to be dropped."""
        late = self._late.pop(job_id, None)
        if late is None:
            self._due.pop(job_id, None)
            return False
        event, keys = late
        event.set()
        for key in keys:
            n = self._late_keys[key] - 1
            if n:
                self._late_keys[key] = n
            else:
                del self._late_keys[key]
        return True

    def expire(self) -> list[tuple[int, threading.Event]]:
        """The tracked promotions past their deadline, each with its new event."""
        if not self._due:
            return []
        now = self._clock()
        out = []
        for job_id in [j for j, (due, _) in self._due.items() if due <= now]:
            _, keys = self._due.pop(job_id)
            event = threading.Event()
            self._late[job_id] = (event, keys)
            for key in keys:
                self._late_keys[key] = self._late_keys.get(key, 0) + 1
            out.append((job_id, event))
        return out

    def is_late(self, key: bytes) -> bool:
        """Whether a late promotion still reads `key`."""
        return key in self._late_keys

    def release_all(self) -> None:
        """Every job of the tier has ended (drained or closed): set every event.
        The late jobs' results, when the tier hands them over, are still dropped."""
        for event, _ in self._late.values():
            event.set()

    @property
    def tracking(self) -> bool:
        """Promotions with a deadline not yet reached."""
        return bool(self._due)

    @property
    def late(self) -> int:
        """Late promotions whose result the kvtiers tier has not handed over yet."""
        return len(self._late)

    @property
    def releases_pending(self) -> int:
        """Late promotions whose chunks the tier's I/O may still touch."""
        return sum(not event.is_set() for event, _ in self._late.values())
