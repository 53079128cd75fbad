"""`MeteredTier`: the event metrics of one secondary tier (`kvtiers.metrics.defs`),
recorded around it where the manager calls it.

It runs on the scheduler thread only and records through the `MetricsSink` it is
given; with `MetricsRecorder` that is a dict update in the thread's own shard, no
lock (see `kvtiers.metrics.recorder`). Its cost per call is O(1): a perf_counter
read, a dict update; nothing grows with the blocks held. It lives with the manager
because `build_manager` wraps each tier in one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kvtiers.contract.inventory import TierInventory
from kvtiers.contract.jobs import JobResult, TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.metrics import BindingSink, MetricsSink
from kvtiers.contract.parent import ParentManager
from kvtiers.contract.stats import TierStats
from kvtiers.contract.tier import SecondaryTier

#: RETRY answers remembered for the probe-latency histogram (oldest dropped beyond)
MAX_PROBING = 1 << 16

_RESULT = {LookupResult.HIT: "hit", LookupResult.MISS: "miss", LookupResult.RETRY: "retry",
           LookupResult.HIT_PENDING: "pending"}


def _counter(sink: MetricsSink, name: str, **labels: str) -> Callable[[float], None]:
    if isinstance(sink, BindingSink):
        return sink.counter(name, **labels)
    return lambda value: sink.count(name, value, **labels)


def _observer(sink: MetricsSink, name: str, **labels: str) -> Callable[[float], None]:
    if isinstance(sink, BindingSink):
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


__all__ = ["MAX_PROBING", "MeteredTier"]
