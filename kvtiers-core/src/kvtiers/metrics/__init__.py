"""Metrics: what kvtiers measures, how it is recorded, how it is exported.

- `kvtiers.metrics.defs`: every metric, defined once (docs/metrics.md is generated
  from it);
- `MetricsRecorder` (`recorder`): a lock-free `MetricsSink` and the stats snapshot
  the scheduler thread publishes;
- `MeteredManager` (`instrument`): the manager's calls timed, its stats published,
  on the scheduler thread (each tier's own metrics: `kvtiers.manager.MeteredTier`);
- `MetricsExporter`, `MetricsServer` (`prometheus`): Prometheus exposition (the
  extra `kvtiers-core[metrics]`).

The sink a tier reports through is the contract's (`kvtiers.contract.MetricsSink`).
`MeteredManager` and the exporter are imported on first use: recording does not pay
for the manager or for prometheus_client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtiers.lazy import lazy_names
from kvtiers.metrics.recorder import HistogramValue, MetricsRecorder

if TYPE_CHECKING:
    from kvtiers.metrics.instrument import TIMED_CALLS, MeteredManager
    from kvtiers.metrics.prometheus import (
        METRICS_EXTRA,
        MetricsExporter,
        MetricsPortError,
        MetricsServer,
        require_prometheus,
    )

__all__ = [
    "METRICS_EXTRA",
    "TIMED_CALLS",
    "HistogramValue",
    "MeteredManager",
    "MetricsExporter",
    "MetricsPortError",
    "MetricsRecorder",
    "MetricsServer",
    "require_prometheus",
]

# name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "TIMED_CALLS": "kvtiers.metrics.instrument",
    "MeteredManager": "kvtiers.metrics.instrument",
    "METRICS_EXTRA": "kvtiers.metrics.prometheus",
    "MetricsExporter": "kvtiers.metrics.prometheus",
    "MetricsPortError": "kvtiers.metrics.prometheus",
    "MetricsServer": "kvtiers.metrics.prometheus",
    "require_prometheus": "kvtiers.metrics.prometheus",
}


__getattr__ = lazy_names(__name__, _LAZY)
