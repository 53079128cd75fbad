"""Prometheus exposition of kvtiers' metrics (needs `prometheus_client`: the extra
`kvtiers-core[metrics]`).

`MetricsExporter(recorder)` is a `prometheus_client` collector: at each scrape it
turns what a `MetricsRecorder` holds - the event series and the stats snapshot the
scheduler thread published - into the metrics `kvtiers.metrics.defs` defines.
`serve(port)` exposes them over HTTP on 127.0.0.1. The scrape runs on the HTTP
server's thread and reads only the recorder (see there why that needs no lock);
it never calls into the manager or a tier.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kvtiers.errors import KvtiersError, MissingExtraError
from kvtiers.metrics.defs import (
    ALL_METRICS,
    MANAGER_METRICS,
    POOL_LOOKUP_RESULTS,
    TIER_METRICS,
    MetricDef,
)
from kvtiers.metrics.recorder import LabelKey, MetricsRecorder

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

METRICS_EXTRA = "metrics"
_BREAKER_STATES = ("closed", "open", "half_open")


def require_prometheus(feature: str) -> None:
    """Raise `MissingExtraError` naming the extra when prometheus_client is missing."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs prometheus_client, which cannot be imported here ({exc}): "
            f"pip install 'kvtiers-core[{METRICS_EXTRA}]'",
            extra=METRICS_EXTRA, package="prometheus_client",
        ) from exc


class MetricsExporter:
    """A `prometheus_client` collector over `recorder` (register it, or `serve`)."""

    def __init__(self, recorder: MetricsRecorder):
        require_prometheus("exporting metrics")
        self.recorder = recorder

    def describe(self) -> list[Metric]:
        # Without it prometheus_client would call collect() at registration.
        return [_family(m) for m in ALL_METRICS]

    def collect(self) -> Iterator[Metric]:
        stats = self.recorder.published() or {}
        tiers: Mapping[str, Mapping[str, Any]] = stats.get("tiers", {})
        pool: Mapping[str, Any] = stats.get("pool", {})
        for m in TIER_METRICS:
            fam = _family(m)
            if m.event is not None:
                self._events(fam, m)
            else:
                for name, t in sorted(tiers.items()):
                    _tier_stat(fam, m, name, t)
            yield fam
        for m in MANAGER_METRICS:
            fam = _family(m)
            if m.event is not None:
                self._events(fam, m)
            elif m.stat == "lookups":
                for field, result in POOL_LOOKUP_RESULTS.items():
                    if field in pool:
                        fam.add_metric([result], float(pool[field]))
            elif m.stat is not None and m.stat in pool:
                fam.add_metric([], float(pool[m.stat]))
            yield fam

    def _events(self, fam: Any, m: MetricDef) -> None:
        """The recorder's series of `m.event`, summed over labels `m` does not have
        (a manager-wide metric over its tiers)."""
        assert m.event is not None
        if m.kind == "histogram":
            for labels, h in _project(self.recorder.histograms(m), m.labels):
                fam.add_metric(labels, [(_bound(b), n) for b, n in h[0]], h[1])
            return
        for labels, v in _project_sum(self.recorder.counters(m.event), m.labels):
            fam.add_metric(labels, v)

    def registry(self) -> CollectorRegistry:
        """A registry of its own holding this collector only."""
        from prometheus_client import CollectorRegistry

        reg = CollectorRegistry(auto_describe=True)
        reg.register(self)
        return reg

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve `/metrics` on `host:port` (0: a free port) from a daemon thread.
        `MetricsPortError` when it cannot listen there (the port in use, say)."""
        from prometheus_client import start_http_server

        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry())
        except OSError as exc:
            raise MetricsPortError(host, port, exc) from exc
        return MetricsServer(server, thread)


class MetricsPortError(KvtiersError):
    """`MetricsExporter.serve` cannot listen on its address: the message says which,
    why, and what to change (the commands print it and exit 2)."""

    def __init__(self, host: str, port: int, cause: OSError):
        self.errno = cause.errno
        if cause.errno == errno.EADDRINUSE:
            why = ("the port is in use (another program holds it); pick another port "
                   "(0 picks a free one) or stop that program")
        elif cause.errno == errno.EACCES:
            why = "permission denied (ports below 1024 need privileges); pick another port"
        else:
            why = cause.strerror or str(cause) or type(cause).__name__
        super().__init__(f"cannot serve metrics on http://{host}:{port}/metrics: {why}")


class MetricsServer:
    """A running `/metrics` endpoint: `port`, `url`, `close()`."""

    def __init__(self, server: Any, thread: Any):
        self._server = server
        self._thread = thread
        self.host, self.port = server.server_address[:2]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _family(m: MetricDef) -> Any:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    if m.kind == "counter":
        # prometheus_client adds `_total` to a counter family's name itself
        return CounterMetricFamily(m.name.removesuffix("_total"), m.help, labels=m.labels)
    if m.kind == "gauge":
        return GaugeMetricFamily(m.name, m.help, labels=m.labels)
    return HistogramMetricFamily(m.name, m.help, labels=m.labels)


def _tier_stat(fam: Any, m: MetricDef, name: str, t: Mapping[str, Any]) -> None:
    assert m.stat is not None
    value = t.get(m.stat)
    if m.stat == "breaker":
        for state in _BREAKER_STATES:
            fam.add_metric([name, state], 1.0 if value == state else 0.0)
    elif isinstance(value, Mapping):  # by reason
        for reason, n in sorted(value.items()):
            fam.add_metric([name, str(reason)], float(n))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        fam.add_metric([name], float(value))


def _bound(b: float) -> str:
    return "+Inf" if math.isinf(b) else repr(float(b))


def _keep(labels: LabelKey, names: tuple[str, ...]) -> tuple[str, ...]:
    d = dict(labels)
    return tuple(d.get(n, "") for n in names)


def _project_sum(series: Iterator[tuple[LabelKey, float]],
                 names: tuple[str, ...]) -> list[tuple[list[str], float]]:
    out: dict[tuple[str, ...], float] = {}
    for labels, v in series:
        k = _keep(labels, names)
        out[k] = out.get(k, 0.0) + v
    return [(list(k), v) for k, v in sorted(out.items())]


def _project(series: Iterator[tuple[LabelKey, Any]], names: tuple[str, ...]
             ) -> list[tuple[list[str], tuple[list[tuple[float, float]], float]]]:
    out: dict[tuple[str, ...], tuple[list[tuple[float, float]], float]] = {}
    for labels, h in series:
        k = _keep(labels, names)
        if k in out:
            buckets, total = out[k]
            out[k] = ([(b, n + h.buckets[i][1]) for i, (b, n) in enumerate(buckets)],
                      total + h.sum)
        else:
            out[k] = (list(h.buckets), h.sum)
    return [(list(k), v) for k, v in sorted(out.items())]


__all__ = ["METRICS_EXTRA", "MetricsExporter", "MetricsServer", "require_prometheus"]
