#!/usr/bin/env python3
"""Figures and tables of bench/vllm_compare.py: the medians of a scenario's runs, the
goal, and the tables it prints, one vLLM version or several side by side.

    python bench/vllm_compare_report.py bench/results/vllm_compare_vllm-*_<machine>.json

prints the side-by-side markdown tables (one per scenario, every stack on every vLLM
version the files hold) that docs/vllm.md shows. Pure: reads the JSON files only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: The stacks the goal compares: kvtiers' spec against vLLM's own, on one version.
OURS, THEIRS = "kvtiers-spec", "vllm-tiering"
GOAL = (
    f"{OURS}: hit_rate >= {THEIRS}'s, and sched_us_p50 and sched_us_p99 (scheduler CPU "
    "time per step) <= its, by the medians of the runs on one vLLM version"
)


def summarize(
    runs: Sequence[Mapping[str, float]],
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The median of every figure over `runs`, and each figure's [min, max]."""
    keys = list(runs[0])
    median = {k: float(statistics.median(r[k] for r in runs)) for k in keys}
    spread = {k: [float(min(r[k] for r in runs)), float(max(r[k] for r in runs))] for k in keys}
    return median, spread


def goal(median: Mapping[str, Mapping[str, float]]) -> dict[str, Any] | None:
    """Whether `OURS` met the goal against `THEIRS` (None when either did not run), and
    by how much each part."""
    ours, theirs = median.get(OURS), median.get(THEIRS)
    if ours is None or theirs is None:
        return None
    parts = {
        "hit_rate": ours["hit_rate"] >= theirs["hit_rate"],
        "sched_us_p50": ours["sched_us_p50"] <= theirs["sched_us_p50"],
        "sched_us_p99": ours["sched_us_p99"] <= theirs["sched_us_p99"],
    }
    return {"met": all(parts.values()), "parts": parts}


def paired_ratios(runs: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, list[float]]:
    """`OURS` / `THEIRS` of the scheduler and manager times, run by run (the two ran
    back to back in each run, so a slow spell of the machine hits both)."""
    theirs = {r["run"]: r for r in runs.get(THEIRS, [])}
    keys = ("sched_us_p50", "sched_us_p99", "manager_us_p50", "manager_us_p99")
    out: dict[str, list[float]] = {k: [] for k in keys}
    for a in runs.get(OURS, []):
        b = theirs.get(a["run"])  # None: that run of theirs stalled
        for k in keys:
            if b is not None and b[k] > 0:
                out[k].append(a[k] / b[k])
    return out


def _pct(v: float) -> str:
    return f"{v:.1%}"


def _us(v: float) -> str:
    return f"{v:.0f}"


def _with_range(key: str, fmt: Callable[[float], str]) -> Callable[[dict[str, Any]], str]:
    def cell(s: dict[str, Any]) -> str:
        lo, hi = s["range"][key]
        mid = fmt(s["median"][key])
        if fmt(lo) == fmt(hi):
            return mid
        return f"{mid} [{fmt(lo)}–{fmt(hi)}]"

    return cell


#: (header, cell of one stack's summary {"median": ..., "range": ...})
COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("hit rate", _with_range("hit_rate", _pct)),
    (
        "loaded / ideal",
        lambda s: f"{s['median']['loaded_blocks']:.0f} / {s['median']['ideal_blocks']:.0f}",
    ),  # fmt: skip
    ("sched µs/step p50", _with_range("sched_us_p50", _us)),
    ("p99", _with_range("sched_us_p99", _us)),
    ("manager µs/step p50", _with_range("manager_us_p50", _us)),
    ("p99", _with_range("manager_us_p99", _us)),
    ("manager share", lambda s: _pct(s["median"]["manager_share"])),
    ("bytes verified", lambda s: f"{s['median']['bytes_verified']:,.0f}"),
]


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def scenario_table(per_version: Mapping[str, Mapping[str, Any]]) -> str:
    """One scenario's markdown table: every stack, on every version given
    ({vLLM version: the scenario's entry of that version's JSON}), stack by stack."""
    stacks: list[str] = []
    for entry in per_version.values():
        stacks += [s for s in entry["median"] if s not in stacks]
    rows = []
    for stack in stacks:
        for version, entry in per_version.items():
            if stack not in entry["median"]:
                continue
            summary = {"median": entry["median"][stack], "range": entry["range"][stack]}
            rows.append([stack, version] + [cell(summary) for _, cell in COLUMNS])
    return markdown(["stack", "vLLM"] + [h for h, _ in COLUMNS], rows)


def goal_lines(per_version: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A line per version: the goal's verdict and the paired ratios behind it."""
    lines = []
    for version, entry in per_version.items():
        g = entry.get("goal")
        if g is None:
            lines.append(f"- vLLM {version}: goal not evaluated ({OURS} or {THEIRS} missing)")
            continue
        missed = [k for k, ok in g["parts"].items() if not ok]
        verdict = "met" if g["met"] else "missed (" + ", ".join(missed) + ")"
        ratios = entry.get("paired_ratios", {})
        said = []
        for key in ("sched_us_p50", "sched_us_p99"):
            values = ratios.get(key) or []
            if values:
                said.append(
                    f"{key.removeprefix('sched_us_')} {statistics.median(values):.2f} "
                    f"[{min(values):.2f}–{max(values):.2f}]"
                )
        paired = f"; {OURS} / {THEIRS} run by run: " + ", ".join(said) if said else ""
        pooled = entry.get("pooled_steps", {})
        if OURS in pooled and THEIRS in pooled:
            o, t = pooled[OURS], pooled[THEIRS]
            paired += (
                f"; every step of every run pooled: p50 {o['sched_us_p50']:.0f} vs "
                f"{t['sched_us_p50']:.0f} µs, p99 {o['sched_us_p99']:.0f} vs "
                f"{t['sched_us_p99']:.0f} µs"
            )
        lines.append(f"- vLLM {version}: goal {verdict}{paired}")
    return lines


def side_by_side(docs: Sequence[Mapping[str, Any]]) -> str:
    """The markdown of every scenario of `docs` (one JSON document per vLLM version)."""
    ordered = sorted(docs, key=lambda d: [int(p) for p in d["vllm"].split("+")[0].split(".")[:2]])
    names: list[str] = []
    for doc in ordered:
        names += [n for n in doc["scenarios"] if n not in names]
    out = []
    for name in names:
        per_version = {d["vllm"]: d["scenarios"][name] for d in ordered if name in d["scenarios"]}
        what = next(iter(per_version.values()))["what"]
        out += [f"**{name}**: {what}.", "", scenario_table(per_version), ""]
        out += goal_lines(per_version) + [""]
    loads = ", ".join(
        f"vLLM {d['vllm']} {d['load_avg']['min']:.1f}–{d['load_avg']['max']:.1f}" for d in ordered
    )
    out.append(f"Load average (1 min) during the runs: {loads}.")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm_compare_report.py",
        description="Side-by-side markdown tables of bench/vllm_compare.py's JSON files "
        "(one per vLLM version), as docs/vllm.md shows them.",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE",
                        help="vllm_compare_vllm-<version>_<machine>.json")
    args = parser.parse_args(argv)
    docs = []
    for path in args.files:
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            parser.error(f"{path}: cannot read it as JSON ({exc})")
    print(side_by_side(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
