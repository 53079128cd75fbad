"""`MetricsRecorder`: a `MetricsSink` that records without taking a lock, and the
snapshot the scheduler thread publishes for the scrape.

Why no lock: the scheduler thread records (lookups, job latencies, its own calls)
and so do tier threads (a tier reporting through `TierContext.metrics`). A lock
shared between them would let a tier thread - descheduled while holding it - stall
the scheduler; `prometheus_client`'s own metric objects take one per value. So each
recording thread writes only to its own *shard* (found through a
`threading.local`), and the scrape thread reads every shard:

- a shard is created once per thread and appended to a list; `list.append` and
  the reads below are single operations on built-in objects, atomic in CPython (the
  GIL; free-threaded builds lock each dict and list internally);
- only the owning thread writes a shard's dicts and histogram lists; a reader takes
  `dict.copy()` (one C call) and `list(...)` of each histogram, so it never sees a
  dict change size under it. It may see a histogram's buckets one observation ahead
  of its sum - the scrape derives `_count` from the buckets, so count and buckets
  always agree;
- shards are never removed, so counters never go down while the process lives.

The stats snapshot (`publish` / `published`) is one reference assignment: the
scheduler thread builds a new dict, the scrape thread reads whichever is current.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtiers.contract.metrics import LabelledSink
from kvtiers.metrics.defs import BY_EVENT, MetricDef

LabelKey = tuple[tuple[str, str], ...]
UNKNOWN_EVENT = "-"


@dataclass
class _Shard:
    counts: dict[tuple[str, LabelKey], float] = field(default_factory=dict)
    # per series: a count per bucket (the last for +Inf), then the sum
    hists: dict[tuple[str, LabelKey], list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class HistogramValue:
    """Cumulative buckets (upper bound, count), as Prometheus exposes them."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float


class MetricsRecorder:
    """See the module docstring. `bind(**labels)` gives a sink that adds labels."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._shards: list[_Shard] = []
        self._published: Mapping[str, Any] | None = None

    # -- recording: any thread, no lock -------------------------------------------

    def _shard(self) -> _Shard:
        shard: _Shard | None = getattr(self._local, "shard", None)
        if shard is None:
            shard = self._local.shard = _Shard()
            self._shards.append(shard)
        return shard

    def count(self, name: str, value: float = 1.0, **labels: str) -> None:
        metric = BY_EVENT.get(name)
        if metric is None or metric.buckets:
            self._unknown(name)
            return
        counts = self._shard().counts
        key = (name, tuple(sorted(labels.items())))
        counts[key] = counts.get(key, 0.0) + value

    def observe(self, name: str, value: float, **labels: str) -> None:
        metric = BY_EVENT.get(name)
        if metric is None or not metric.buckets:
            self._unknown(name)
            return
        shard = self._shard()
        key = (name, tuple(sorted(labels.items())))
        h = shard.hists.get(key)
        if h is None:
            h = shard.hists[key] = [0.0] * (len(metric.buckets) + 2)
        h[bisect.bisect_left(metric.buckets, value)] += 1
        h[-1] += value

    def counter(self, name: str, **labels: str) -> Callable[[float], None]:
        """`count(name, value, **labels)` with the labels bound: the series key is
        built once, so a call costs a thread-local read and a dict update (what the
        scheduler-side instrumentation uses on every call)."""
        metric = BY_EVENT.get(name)
        if metric is None or metric.buckets:
            return lambda value: self._unknown(name)
        key = (name, tuple(sorted(labels.items())))
        local, new_shard = self._local, self._shard

        def add(value: float = 1.0) -> None:
            shard: _Shard | None = getattr(local, "shard", None)
            counts = (shard or new_shard()).counts
            counts[key] = counts.get(key, 0.0) + value

        return add

    def observer(self, name: str, **labels: str) -> Callable[[float], None]:
        """`observe(name, value, **labels)` with the labels bound (see `counter`)."""
        metric = BY_EVENT.get(name)
        if metric is None or not metric.buckets:
            return lambda value: self._unknown(name)
        key = (name, tuple(sorted(labels.items())))
        buckets, width = metric.buckets, len(metric.buckets) + 2
        local, new_shard, where = self._local, self._shard, bisect.bisect_left

        def add(value: float) -> None:
            shard: _Shard | None = getattr(local, "shard", None)
            hists = (shard or new_shard()).hists
            h = hists.get(key)
            if h is None:
                h = hists[key] = [0.0] * width
            h[where(buckets, value)] += 1
            h[-1] += value

        return add

    def _unknown(self, name: str) -> None:
        """A report no metric is defined for (or a count of a histogram, an
        observation of a counter): dropped, and counted by name."""
        counts = self._shard().counts
        key = (UNKNOWN_EVENT, (("event", name),))
        counts[key] = counts.get(key, 0.0) + 1.0

    def bind(self, **labels: str) -> LabelledSink:
        return LabelledSink(self, labels)

    # -- the stats snapshot: written by the scheduler thread ----------------------

    def publish(self, stats: Mapping[str, Any]) -> None:
        """The scheduler thread's latest `manager.stats()` (plus what the
        instrumentation adds): one reference assignment."""
        self._published = stats

    def published(self) -> Mapping[str, Any] | None:
        return self._published

    # -- reading: the scrape thread -----------------------------------------------

    def counters(self, name: str) -> Iterator[tuple[LabelKey, float]]:
        """Every series of counter event `name`, summed over the shards."""
        total: dict[LabelKey, float] = {}
        for shard in list(self._shards):
            for (n, labels), v in shard.counts.copy().items():
                if n == name:
                    total[labels] = total.get(labels, 0.0) + v
        return iter(sorted(total.items()))

    def histograms(self, metric: MetricDef) -> Iterator[tuple[LabelKey, HistogramValue]]:
        """Every series of histogram `metric`, summed over the shards."""
        assert metric.event is not None
        total: dict[LabelKey, list[float]] = {}
        for shard in list(self._shards):
            for (event, labels), h in shard.hists.copy().items():
                if event != metric.event:
                    continue
                acc = total.setdefault(labels, [0.0] * len(h))
                for i, v in enumerate(list(h)):
                    acc[i] += v
        for labels, acc in sorted(total.items()):
            cum: list[tuple[float, float]] = []
            running = 0.0
            for bound, n in zip((*metric.buckets, float("inf")), acc[:-1], strict=True):
                running += n
                cum.append((bound, running))
            yield labels, HistogramValue(tuple(cum), running, acc[-1])


__all__ = ["HistogramValue", "MetricsRecorder"]
