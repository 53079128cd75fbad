"""The metrics sink a tier reports to. Anything with `count` and `observe` works
(a Prometheus adapter, a test recorder); `NullMetrics` drops everything.

The names a sink understands, and the Prometheus metric each feeds, are defined in
`kvtiers.metrics.defs` (docs/metrics.md). `kvtiers.metrics.recorder.MetricsRecorder`
records them without a lock; `kvtiers.metrics.prometheus` exports them (the extra
`kvtiers-core[metrics]`). A sink may be called from any thread, the scheduler's
included: it must never block."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable


class MetricsSink(Protocol):
    def count(self, name: str, value: float = 1.0, **labels: str) -> None: ...

    def observe(self, name: str, value: float, **labels: str) -> None: ...


@runtime_checkable
class BindingSink(MetricsSink, Protocol):
    """A sink that also hands out a recorder bound to one series, for callers that
    report the same series often (`MetricsRecorder`: no dict lookup per report)."""

    def counter(self, name: str, **labels: str) -> Callable[[float], None]: ...

    def observer(self, name: str, **labels: str) -> Callable[[float], None]: ...


class NullMetrics:
    def count(self, name: str, value: float = 1.0, **labels: str) -> None:
        pass

    def observe(self, name: str, value: float, **labels: str) -> None:
        pass


class RecordingMetrics:
    """Keeps totals in a dict keyed by (name, sorted labels); for tests and `stats`."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.observations: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}

    def count(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.counts[key] = self.counts.get(key, 0.0) + value

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.observations.setdefault(key, []).append(value)


class LabelledSink:
    """A `MetricsSink` that adds fixed labels to every report (each tier gets its
    sink labelled with `tier=<its name>`)."""

    def __init__(self, sink: MetricsSink, labels: Mapping[str, str] | None = None,
                 **more: str):
        self._sink = sink
        self._labels = {**(labels or {}), **more}

    def count(self, name: str, value: float = 1.0, **labels: str) -> None:
        self._sink.count(name, value, **{**self._labels, **labels})

    def observe(self, name: str, value: float, **labels: str) -> None:
        self._sink.observe(name, value, **{**self._labels, **labels})
