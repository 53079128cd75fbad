"""What records the event metrics (`kvtiers.metrics_defs`): `MeteredTier` around
each secondary tier, `MeteredManager` around the manager.

Both run on the scheduler thread only - they are called where the manager (or
the engine) calls the object they wrap - and record through a `MetricsSink`; with
`MetricsRecorder` that is a dict update in the thread's own shard, no lock (see
`kvtiers.metrics_recorder`). Their cost per call is O(1): a perf_counter read, a
dict update; nothing grows with the blocks held.

`MeteredManager` also publishes the manager's `stats()` for the scrape, from the
scheduler thread, at most every `publish_interval_s`: the scrape thread never calls
into the manager or a tier (whose `stats()` is a scheduler-thread call).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from kvtiers.inventory import TierInventory
from kvtiers.jobs import JobResult, TransferJob
from kvtiers.keys import BlockKey
from kvtiers.lookup import LookupResult
from kvtiers.manager.events import OffloadEvent, PrefixLookup, PrepareStoreOutput
from kvtiers.manager.manager import TieringOffloadingManager
from kvtiers.metrics import MetricsSink
from kvtiers.metrics_recorder import MetricsRecorder
from kvtiers.parent import ParentManager
from kvtiers.stats import TierStats
from kvtiers.tier import SecondaryTier

#: RETRY answers remembered for the probe-latency histogram (oldest dropped beyond)
MAX_PROBING = 1 << 16

_RESULT = {LookupResult.HIT: "hit", LookupResult.MISS: "miss", LookupResult.RETRY: "retry",
           LookupResult.HIT_PENDING: "pending"}
_T = TypeVar("_T")


def _counter(sink: MetricsSink, name: str, **labels: str) -> Callable[[float], None]:
    if isinstance(sink, MetricsRecorder):
        return sink.counter(name, **labels)
    return lambda value: sink.count(name, value, **labels)


def _observer(sink: MetricsSink, name: str, **labels: str) -> Callable[[float], None]:
    if isinstance(sink, MetricsRecorder):
        return sink.observer(name, **labels)
    return lambda value: sink.observe(name, value, **labels)


class MeteredTier(SecondaryTier):
    """`inner`, recording per call: lookups by answer, the time from a RETRY to the
    answer (probe latency), each job's seconds by kind, promotions in flight. Its
    capability flags are `inner`'s; anything else is `inner`'s too."""

    def __init__(self, inner: SecondaryTier, name: str, sink: MetricsSink):
        super().__init__(inner.ctx, inner.config)
        self.inner = inner
        self.name = name
        self.persistent = inner.persistent
        self.shared = inner.shared
        self.serves_peers = inner.serves_peers
        self.verifies = inner.verifies
        self._sink = sink
        self._jobs: dict[int, tuple[str, int]] = {}  # job id -> (kind, keys)
        self._probing: dict[BlockKey, float] = {}
        # The calls made per lookup and per job, with their labels bound once.
        self._lookups = {r: _counter(sink, "tier_lookup", tier=name, result=label)
                         for r, label in (*_RESULT.items(), (None, "error"))}
        self._probe_seconds = _observer(sink, "tier_probe_seconds", tier=name)
        self._job_seconds = {kind: _observer(sink, "tier_job_seconds", tier=name, kind=kind)
                             for kind in ("store", "load", "unknown")}
        self._in_flight = _counter(sink, "tier_promotions_in_flight", tier=name)

    def __getattr__(self, attr: str) -> Any:
        # Only reached for what this class lacks (a tier's own extras: tests, tools).
        return getattr(self.__dict__["inner"], attr)

    def lookup(self, key: BlockKey) -> LookupResult:
        try:
            answer = self.inner.lookup(key)
        except Exception:
            self._lookups[None](1.0)
            raise
        return self._record(key, answer)

    def lookup_in_request(self, key: BlockKey, request_id: str) -> LookupResult:
        try:
            answer = self.inner.lookup_in_request(key, request_id)
        except Exception:
            self._lookups[None](1.0)
            raise
        return self._record(key, answer)

    def answers_in_request(self) -> bool:
        return self.inner.answers_in_request()

    def _record(self, key: BlockKey, answer: LookupResult) -> LookupResult:
        self._lookups[answer](1.0)
        probing = self._probing
        if answer is LookupResult.RETRY:
            if key not in probing:
                if len(probing) >= MAX_PROBING:
                    del probing[next(iter(probing))]
                probing[key] = time.perf_counter()
        elif probing:
            started = probing.pop(key, None)
            if started is not None:
                self._probe_seconds(time.perf_counter() - started)
        return answer

    def submit_store(self, job: TransferJob) -> None:
        self._jobs[job.job_id] = ("store", len(job.keys))
        self.inner.submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        n = len(job.keys)
        self._jobs[job.job_id] = ("load", n)
        self._in_flight(n)
        self.inner.submit_load(job)

    def get_finished_jobs(self) -> list[JobResult]:
        results = self.inner.get_finished_jobs()
        jobs = self._jobs
        for r in results:
            kind, n = jobs.pop(r.job_id, ("unknown", 0))
            self._job_seconds[kind](r.seconds)
            if kind == "load":
                self._in_flight(-n)
        return results

    def drain(self, timeout: float | None = None) -> bool:
        return self.inner.drain(timeout)

    def close(self) -> None:
        self.inner.close()

    def stats(self) -> TierStats:
        return self.inner.stats()

    def touch(self, keys: Iterable[BlockKey]) -> None:
        self.inner.touch(keys)

    def on_request_start(self, request_id: str, params: Mapping[str, Any] | None = None) -> None:
        self.inner.on_request_start(request_id, params)

    def on_request_finished(self, request_id: str) -> None:
        self.inner.on_request_finished(request_id)

    def inventory(self, *, ages: bool = False) -> TierInventory:
        return self.inner.inventory(ages=ages)

    def serve_external_requests(self, parent: ParentManager) -> None:
        self.inner.serve_external_requests(parent)


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


__all__ = ["MAX_PROBING", "TIMED_CALLS", "MeteredManager", "MeteredTier"]
