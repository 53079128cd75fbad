"""docs/metrics.md is generated from the definitions (kvtiers.metrics.defs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvtiers.metrics.defs import ALL_METRICS, MetricDef, render_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_docs_page_is_the_generated_one() -> None:
    assert DOC.read_text() == render_markdown(), (
        "docs/metrics.md is stale: PYTHONPATH=kvtiers-core/src python -m "
        "kvtiers.metrics.defs > docs/metrics.md")


def test_every_metric_is_named_after_the_prometheus_conventions() -> None:
    names = [m.name for m in ALL_METRICS]
    assert len(names) == len(set(names))
    for m in ALL_METRICS:
        assert m.name.startswith("kvtiers_") and m.name == m.name.lower(), m.name
        assert m.name in DOC.read_text()
        if m.kind == "histogram":
            assert m.name.endswith("_seconds") and list(m.buckets) == sorted(m.buckets)
        if "bytes" in m.name:
            assert m.name.endswith(("_bytes", "_bytes_total")), m.name
        scope = "tier" if m.name.startswith("kvtiers_tier_") else None
        assert ("tier" in m.labels) == (scope == "tier"), m.name


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"name": "kvtiers_x", "kind": "counter", "event": "x"}, "_total"),
        ({"name": "kvtiers_x_total", "kind": "gauge", "event": "x"}, "_total"),
        ({"name": "kvtiers_x_seconds", "kind": "histogram", "event": "x"}, "buckets"),
        ({"name": "kvtiers_x", "kind": "gauge"}, "exactly one"),
        ({"name": "kvtiers_x", "kind": "gauge", "event": "x", "stat": "y"}, "exactly one"),
    ],
)
def test_a_definition_against_the_conventions_is_refused(kwargs: dict[str, str],
                                                          why: str) -> None:
    with pytest.raises(ValueError, match=why):
        MetricDef(help="h", **kwargs)  # type: ignore[arg-type]
