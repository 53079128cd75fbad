"""`kvtiers bench --plot`: where prompt tokens came from and how fast each path
moved bytes, over the run (matplotlib, imported only when a plot is drawn).

Top panel: per time bin, the share of prompt tokens each source served (the CPU
pool, each tier's promotions), their sum (the total hit rate) and the share
recomputed: the sources plus the recomputed share make 100%. Bottom panel: GB/s
per path. With write-through, GPU -> CPU pool and CPU pool -> fs move the same
bytes at the same time: the GPU paths are drawn wide and pale underneath, the
tiers' thin and dashed on top, so both stay visible.

Bins are the intervals between the run's samples (about a second); the last one
ends when the run does and may be a sliver, whose few tokens or bytes would draw a
spike: a final bin shorter than half the usual one is merged into the bin before.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from kvtiers.bench.results import CPU, GPU, RunResult, Sample


class PlotUnavailable(RuntimeError):
    pass


MATPLOTLIB_HINT = (
    "--plot needs matplotlib, which is not installed here: install kvtiers-core's "
    "`plot` extra (`pip install './kvtiers-core[plot]'` in a checkout of the kvtiers "
    "repository, or `pip install matplotlib`), or leave --plot out"
)
TOTAL = "all sources (total hit rate)"
RECOMPUTED = "recomputed (missed everywhere)"


@dataclass
class PlotSeries:
    """What the plot draws: bin midpoints (seconds) and one list per label."""

    t: list[float] = field(default_factory=list)
    shares: dict[str, list[float]] = field(default_factory=dict)  # % of prompt tokens
    gbps: dict[str, list[float]] = field(default_factory=dict)


def bins(samples: list[Sample]) -> list[tuple[Sample, Sample]]:
    """Consecutive sample pairs, a final sliver merged into the bin before it."""
    pairs = list(zip(samples, samples[1:], strict=False))
    if len(pairs) >= 2:
        usual = statistics.median(b.t - a.t for a, b in pairs[:-1])
        last = pairs[-1][1].t - pairs[-1][0].t
        if last < usual / 2:
            pairs[-2:] = [(pairs[-2][0], pairs[-1][1])]
    return pairs


def source_label(name: str) -> str:
    return "CPU pool" if name == CPU else f"{name} (promoted)"


def series(run: RunResult) -> PlotSeries:
    """The numbers behind the plot (also what a test checks)."""
    pairs = bins(run.samples)
    out = PlotSeries(t=[(a.t + b.t) / 2 for a, b in pairs])
    names = [CPU, *run.tier_names]
    for _, b in pairs:  # any other attribution ("one of a, b") the run made
        names += [n for n in b.served_tokens if n not in names]
    for name in [*names, TOTAL, RECOMPUTED]:
        out.shares[name if name in (TOTAL, RECOMPUTED) else source_label(name)] = []
    for a, b in pairs:
        prompt = b.prompt_tokens - a.prompt_tokens
        served = {n: b.served_tokens.get(n, 0) - a.served_tokens.get(n, 0) for n in names}
        total = sum(served.values())
        for name in names:
            out.shares[source_label(name)].append(
                100 * served[name] / prompt if prompt else float("nan")
            )
        out.shares[TOTAL].append(100 * total / prompt if prompt else float("nan"))
        out.shares[RECOMPUTED].append(100 * (prompt - total) / prompt if prompt else float("nan"))
    paths = {f"{GPU} store": "GPU -> CPU pool", f"{GPU} load": "CPU pool -> GPU"}
    for name in run.tier_names:
        paths[f"{name} write"] = f"CPU pool -> {name}"
        paths[f"{name} read"] = f"{name} -> CPU pool"
    for key, label in paths.items():
        out.gbps[label] = [
            (b.bytes.get(key, 0) - a.bytes.get(key, 0)) / (b.t - a.t) / 1e9 if b.t > a.t else 0.0
            for a, b in pairs
        ]
    return out


def check_available() -> None:
    """Raise `PlotUnavailable` now, before a run, if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable(MATPLOTLIB_HINT) from None


def supported_formats() -> list[str]:
    """The file name suffixes matplotlib can write (without the dot)."""
    check_available()
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


@dataclass(frozen=True)
class Drawn:
    """One line as the figure holds it (read back after drawing)."""

    label: str
    y: list[float]
    linestyle: str
    linewidth: float


def write_plot(path: Path, run: RunResult, title: str) -> dict[str, list[Drawn]]:
    """Draw `run` into `path` (the format from its suffix). Returns what each panel
    ("shares", "gbps") drew, read back from the figure."""
    check_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(run.samples) < 2:
        raise PlotUnavailable("--plot: the run was too short to sample anything over time")
    data = series(run)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True)
    for label, values in data.shares.items():
        if label == TOTAL:
            top.plot(data.t, values, label=label, color="black", linewidth=2.2)
        elif label == RECOMPUTED:
            top.plot(data.t, values, label=label, color="tab:red", linestyle="--", linewidth=1.6)
        else:
            top.plot(data.t, values, label=label, linewidth=1.4)
    top.set_ylabel("prompt tokens (%)")
    top.set_ylim(0, 100)
    top.legend(loc="upper left", fontsize="small", ncol=2)
    top.grid(alpha=0.3)
    for label, values in data.gbps.items():
        if label.startswith("GPU") or label.endswith("GPU"):
            bottom.plot(data.t, values, label=label, linewidth=5, alpha=0.45)
        else:
            bottom.plot(data.t, values, label=label, linewidth=1.5, linestyle="--")
    bottom.set_ylabel("GB/s")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper left", fontsize="small", ncol=2)
    bottom.grid(alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    drawn = {
        panel: [
            Drawn(str(line.get_label()), [float(y) for y in line.get_ydata()],
                  str(line.get_linestyle()), float(line.get_linewidth()))
            for line in ax.get_lines()
        ]
        for panel, ax in (("shares", top), ("gbps", bottom))
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn
