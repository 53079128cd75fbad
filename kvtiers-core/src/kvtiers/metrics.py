"""The metrics sink a tier reports to. Anything with `count` and `observe` works
(a Prometheus adapter, a test recorder); `NullMetrics` drops everything."""

from __future__ import annotations

from typing import Protocol


class MetricsSink(Protocol):
    def count(self, name: str, value: float = 1.0, **labels: str) -> None: ...

    def observe(self, name: str, value: float, **labels: str) -> None: ...


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
