"""`MeteredManager`: the manager's scheduler-side calls timed into the event metrics
(`kvtiers.metrics.defs`); each tier's own are `kvtiers.manager.metered_tier`.

It runs on the scheduler thread only - it is called where the engine calls the
manager - and records into a `MetricsRecorder`: a dict update in the thread's own
shard, no lock (see `kvtiers.metrics.recorder`). Its cost per call is O(1).
It also publishes the manager's `stats()` for the scrape, from the scheduler
thread, at most every `publish_interval_s`: the scrape thread never calls into the
manager or a tier (whose `stats()` is a scheduler-thread call).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any, TypeVar

from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.manager.manager import TieringOffloadingManager
from kvtiers.manager.outputs import OffloadEvent, PrefixLookup, PrepareStoreOutput
from kvtiers.metrics.recorder import MetricsRecorder

_T = TypeVar("_T")


#: the scheduler's calls `MeteredManager` times (the `call` label); `step` too
TIMED_CALLS = ("lookup", "lookup_prefix", "prepare_load", "complete_load", "prepare_store",
               "complete_store", "touch", "take_events")


class MeteredManager:
    """The manager's scheduler-side calls, timed into `manager_call_seconds{call}`;
    every other attribute is the manager's. `publish()` (also from `step()`, at
    most every `publish_interval_s` of perf_counter time) hands `stats()` to the
    recorder.

    `call_timing=False` (the config's `metrics.scheduler_call_timing`): the calls
    of `TIMED_CALLS` are the manager's own bound methods, set on the instance - no
    wrapper, no clock read, nothing recorded - and `step` only publishes; the
    histograms stay empty, every counter and gauge (the tiers', the pool's) still
    counts."""

    def __init__(self, manager: TieringOffloadingManager, recorder: MetricsRecorder, *,
                 publish_interval_s: float = 0.5, call_timing: bool = True):
        self.manager = manager
        self.call_timing = call_timing
        self._recorder = recorder
        self._interval = publish_interval_s
        self._next_publish = 0.0
        self._calls: dict[str, Callable[[float], None]] = {}
        if not call_timing:
            for call in TIMED_CALLS:  # instance attributes win over the methods below
                self.__dict__[call] = getattr(manager, call)
        self.publish()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.__dict__["manager"], attr)

    def _timed(self, call: str, fn: Callable[..., _T], *args: Any) -> _T:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            record = self._calls.get(call)
            if record is None:
                record = self._calls[call] = self._recorder.observer(
                    "manager_call_seconds", call=call)
            record(time.perf_counter() - t0)

    def publish(self) -> None:
        """Scheduler thread: snapshot `stats()` for the scrape."""
        self._recorder.publish(self.manager.stats())
        self._next_publish = time.perf_counter() + self._interval

    def lookup(self, key: BlockKey, tiers: Container[int] | None = None,
               request_id: str | None = None) -> LookupResult:
        return self._timed("lookup", self.manager.lookup, key, tiers, request_id)

    def lookup_prefix(self, keys: Iterable[BlockKey],
                      request_id: str | None = None) -> PrefixLookup:
        return self._timed("lookup_prefix", self.manager.lookup_prefix, keys, request_id)

    def prepare_load(self, keys: Sequence[BlockKey]) -> list[int]:
        return self._timed("prepare_load", self.manager.prepare_load, keys)

    def complete_load(self, keys: Sequence[BlockKey]) -> None:
        self._timed("complete_load", self.manager.complete_load, keys)

    def prepare_store(self, keys: Sequence[BlockKey]) -> PrepareStoreOutput | None:
        return self._timed("prepare_store", self.manager.prepare_store, keys)

    def complete_store(self, keys: Sequence[BlockKey], success: bool = True) -> None:
        self._timed("complete_store", self.manager.complete_store, keys, success)

    def touch(self, keys: Sequence[BlockKey]) -> None:
        self._timed("touch", self.manager.touch, keys)

    def take_events(self) -> list[OffloadEvent]:
        return self._timed("take_events", self.manager.take_events)

    def step(self) -> None:
        if self.call_timing:
            self._timed("step", self.manager.step)
        else:
            self.manager.step()
        if time.perf_counter() >= self._next_publish:
            self.publish()

    def close(self) -> None:
        self.publish()  # the final numbers stay on the endpoint
        self.manager.close()


__all__ = ["TIMED_CALLS", "MeteredManager"]
