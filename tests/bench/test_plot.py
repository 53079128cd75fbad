"""`kvtiers bench --plot`: the plot is rendered for real and its series checked:
every source of prompt tokens, their total and the recomputed share (summing to
100%), no spike from the run's last sliver of a bin, and the GPU paths visible
under the tiers' write-through line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from kvtiers.bench.plot import RECOMPUTED, TOTAL, bins, series, write_plot
from kvtiers.bench.results import Counters, RunResult, Sample

pytest.importorskip("matplotlib")

MB = 10**6


def _run() -> RunResult:
    # Cumulative numbers, one sample a second, then the end of the run 50 ms later.
    rows = [  # t, prompt tokens, from the pool, from fs, bytes GPU->pool (= pool->fs)
        (0.0, 0, 0, 0, 0),
        (1.0, 1000, 0, 0, 800 * MB),
        (2.0, 2000, 400, 100, 1400 * MB),
        (3.0, 3000, 900, 300, 1800 * MB),
        (3.05, 3100, 950, 310, 1900 * MB),
    ]
    samples = [
        Sample(t, 0, prompt, {"cpu": cpu, "fs": fs},
               {"gpu store": gb, "gpu load": 0, "fs write": gb, "fs read": fs * 1000})
        for t, prompt, cpu, fs, gb in rows
    ]
    return RunResult("configured stack", 3.05, Counters(), ["fs"], 16, 8192, None, None,
                     samples, {"device": "cpu"})


def test_the_last_sliver_of_a_bin_is_merged_into_the_one_before() -> None:
    run = _run()
    assert [(a.t, b.t) for a, b in bins(run.samples)] == [(0, 1), (1, 2), (2, 3.05)]
    data = series(run)
    assert data.t == [0.5, 1.5, 2.525]
    # 100 MB in 0.05 s would have drawn a 2 GB/s spike; merged, the bin reads 0.48 GB/s.
    assert data.gbps["GPU -> CPU pool"] == pytest.approx([0.8, 0.6, 500 / 1.05 / 1000])


def test_the_shares_of_prompt_tokens_add_up_to_100_percent() -> None:
    data = series(_run())
    assert list(data.shares) == ["CPU pool", "fs (promoted)", TOTAL, RECOMPUTED]
    assert data.shares["CPU pool"] == pytest.approx([0, 40, 550 / 11])
    assert data.shares["fs (promoted)"] == pytest.approx([0, 10, 210 / 11])
    assert data.shares[TOTAL] == pytest.approx([0, 50, 760 / 11])
    for i in range(3):
        hits = data.shares["CPU pool"][i] + data.shares["fs (promoted)"][i]
        assert data.shares[TOTAL][i] == pytest.approx(hits)
        assert data.shares[TOTAL][i] + data.shares[RECOMPUTED][i] == pytest.approx(100)


def test_the_rendered_plot_draws_every_series_and_keeps_overlaps_visible(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "plot.png"
    drawn = write_plot(out, _run(), "title")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = series(_run())
    assert [d.label for d in drawn["shares"]] == list(data.shares)
    for d in drawn["shares"]:
        assert d.y == pytest.approx(data.shares[d.label], nan_ok=True)
    labels = [d.label for d in drawn["gbps"]]
    assert labels == ["GPU -> CPU pool", "CPU pool -> GPU", "CPU pool -> fs", "fs -> CPU pool"]
    lines = {d.label: d for d in drawn["gbps"]}
    gpu, fs = lines["GPU -> CPU pool"], lines["CPU pool -> fs"]
    # Write-through: the same bytes on both paths, at the same time ...
    assert gpu.y == pytest.approx(fs.y)
    # ... drawn so that neither hides the other: wide and solid under thin and dashed.
    assert gpu.linewidth > 2 * fs.linewidth and (gpu.linestyle, fs.linestyle) == ("-", "--")


def test_a_bin_without_prompt_tokens_is_a_gap_not_a_zero() -> None:
    run = _run()
    run.samples[2] = Sample(2.0, 0, 1000, {"cpu": 0, "fs": 0}, run.samples[1].bytes)
    data = series(run)
    assert math.isnan(data.shares[TOTAL][1]) and math.isnan(data.shares[RECOMPUTED][1])
