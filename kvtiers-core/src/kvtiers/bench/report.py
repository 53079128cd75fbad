"""Showing bench results: the summary tables (rich), the `--compare` table and the
JSON document (the plot: `kvtiers.bench.plot`)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvtiers.bench.defaults import written_bytes_bound
from kvtiers.bench.presets import PrefillCost
from kvtiers.bench.results import CPU, RunResult
from kvtiers.humanize import format_bytes

JSON_VERSION = 1


def machine_info() -> dict[str, Any]:
    import torch

    from kvtiers import __version__
    from kvtiers.pool.memory import memory_limits

    info: dict[str, Any] = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "memory_bytes": memory_limits().physical,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "kvtiers": __version__,
        "cuda": torch.cuda.is_available(),
    }
    if info["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def describe_machine(m: dict[str, Any]) -> str:
    gpu = m.get("gpu") or 'none (the "GPU" is a CPU tensor)'
    return (
        f"{m['host']}: {m['cpus']} CPUs, {format_bytes(m['memory_bytes'])} RAM, Python "
        f"{m['python']}, torch {m['torch']}; GPU: {gpu}"
    )


def _n(x: float) -> str:
    return f"{int(x):,}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _gbps(x: float) -> str:
    return f"{x:.2f}"


def _us(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} s"
    return f"{x / 1000:.1f} ms" if x >= 1000 else f"{x:.0f} us"


def _secs(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:,.2f}" if abs(x) >= 1 else f"{x:.3g}"


def _errors(d: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(d.items())) or "-"


def _heading(console: Console, text: str) -> None:
    console.print(f"[bold]{text}[/bold]", highlight=False, soft_wrap=True)


def print_run(console: Console, run: RunResult, header: Sequence[str] = ()) -> None:
    """The summary of one run: where prompt tokens came from, transfers per tier
    and direction, per-tier counters, latencies, and the verification verdict."""
    d = run.as_dict()
    c = run.counters
    for line in header:
        console.print(line, highlight=False, soft_wrap=True)
    rate = f"{c.requests / run.wall_s:.1f}" if run.wall_s else "-"
    _heading(
        console, f"Prompt tokens: {c.requests:,} requests in {run.wall_s:.1f} s ({rate} req/s)"
    )
    tokens = Table()
    for col in ("served from", "tokens", "share"):
        tokens.add_column(col, justify="left" if col == "served from" else "right")
    names = [CPU, *run.tier_names] if run.manager_stats is not None else []
    for name in names:
        label = "CPU pool" if name == CPU else f"{name} (promoted)"
        tokens.add_row(label, _n(c.served_tokens.get(name, 0)), _pct(run.hit_rate(name)))
    for name, v in c.served_tokens.items():  # "one of a, b" attributions, if any
        if name not in names:
            tokens.add_row(name, _n(v), _pct(run.hit_rate(name)))
    recomputed = c.recomputed_tokens / c.prompt_tokens if c.prompt_tokens else 0.0
    tokens.add_row("recomputed", _n(c.recomputed_tokens), _pct(recomputed))
    tokens.add_row(
        "total", _n(c.prompt_tokens), _pct(1.0 if c.prompt_tokens else 0.0), style="bold"
    )
    console.print(tokens)
    if run.manager_stats is None:
        return

    _heading(
        console,
        "Transfers (GB/s busy: bytes over the summed time of the direction's "
        "jobs; avg: over the whole run)",
    )
    moves = Table()
    for col in ("path", "blocks", "bytes", "GB/s busy", "GB/s avg"):
        moves.add_column(col, justify="left" if col == "path" else "right")
    for row in run.transfers():
        moves.add_row(
            row["path"],
            _n(row["blocks"]),
            format_bytes(row["bytes"]),
            _gbps(row["gbps_busy"]),
            _gbps(row["gbps_run"]),
        )
    console.print(moves)

    _heading(
        console,
        "Tiers (hit rate: share of prompt tokens served; lookups: block "
        "lookups as each tier counts them, repeated ones included)",
    )
    tiers = Table()
    for col in (
        "tier",
        "hit rate",
        "lookup hits",
        "lookup misses",
        "evictions",
        "dropped cascades",
        "errors by reason",
    ):
        tiers.add_column(col, justify="left" if col in ("tier", "errors by reason") else "right")
    for name, t in d["tiers"].items():
        tiers.add_row(
            name,
            _pct(t["hit_rate"]),
            _n(t["hits"]),
            _n(t["misses"]),
            _n(t["evictions"]),
            _n(t["cascades_dropped"]),
            _errors({**t["errors"], **t.get("tier_errors", {})}),
        )
    console.print(tiers)

    lat = d["latency"]
    lk, ps, wt = lat["lookup_prefix"], lat["prepare_store"], lat["wait_for_promotion"]
    console.print(
        f"latency: lookup_prefix p50 {_us(lk['p50_us'])}, p99 {_us(lk['p99_us'])} "
        f"({lk['n']:,} calls); prepare_store p50 {_us(ps['p50_us'])}, p99 {_us(ps['p99_us'])} "
        f"({ps['n']:,} calls)",
        highlight=False,
        soft_wrap=True,
    )
    settle = d["settle"]
    if not settle["finished"]:
        console.print(
            f"warning: after the last request the tiers did not finish the "
            f"copies the run queued within {settle['seconds']:.0f} s; the figures leave "
            "out what was still in flight",
            soft_wrap=True,
        )
    elif settle["seconds"] >= 0.5:
        console.print(
            f"after the last request the tiers took {settle['seconds']:.1f} s to finish "
            "the copies the run queued (counted in the figures, not in the run's time)",
            highlight=False,
            soft_wrap=True,
        )
    if wt["n"]:
        console.print(
            f"requests that waited (a prompt block was being stored or promoted, or a tier's "
            f"probe was in flight): {c.waited_requests:,}, waiting p50 "
            f"{_us(wt['p50_us'])}, p99 {_us(wt['p99_us'])}"
            + (f"; {c.gave_up_waiting} gave up after the job timeout" if c.gave_up_waiting else "")
            + (
                f"; {c.thrash_admits} stopped waiting because the pool could not hold their "
                "prefix (promotions evicted each other)"
                if c.thrash_admits
                else ""
            ),
            highlight=False,
            soft_wrap=True,
        )
    if c.hits_evicted_by_lookup:
        console.print(
            f"hits lost before prepare_load (lookup_prefix's own promotions evicted "
            f"them): {c.hits_evicted_by_lookup:,} blocks, recomputed",
            highlight=False,
            soft_wrap=True,
        )
    if c.store_refused:
        console.print(
            f"stores refused (pool pinned full): {c.store_refused:,} blocks not offloaded",
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"[bold]verified[/bold]: {c.verified_blocks:,} blocks "
        f"({format_bytes(c.verified_bytes)}) loaded into the GPU, every byte checked "
        "against what was stored for its key: all match",
        highlight=False,
        soft_wrap=True,
    )


def compare_rows(runs: Sequence[RunResult], cost: PrefillCost) -> dict[str, list[Any]]:
    """The `--compare` numbers, one list (one entry per run) per row."""
    base = runs[0].counters.recomputed_tokens
    rows: dict[str, list[Any]] = {}
    for run in runs:
        c = run.counters
        secondary = sum(v for k, v in c.served_tokens.items() if k != CPU)
        prefill = c.recomputed_tokens * cost.seconds_per_token
        saved = (base - c.recomputed_tokens) * cost.seconds_per_token
        for key, value in (
            ("wall time (s)", run.wall_s),
            ("requests", c.requests),
            ("prompt tokens", c.prompt_tokens),
            ("served from the CPU pool", c.served_tokens.get(CPU, 0)),
            ("served from secondary tiers", secondary),
            ("recomputed tokens", c.recomputed_tokens),
            ("hit rate", run.hit_rate()),
            ("prefill GPU time (s)", prefill),
            ("prefill saved vs no offloading (s)", saved),
            ("prefill saved (%)", saved / (base * cost.seconds_per_token) if base else 0.0),
        ):
            rows.setdefault(key, []).append(value)
    return rows


def print_compare(console: Console, runs: Sequence[RunResult], cost: PrefillCost) -> None:
    _heading(
        console,
        "Same workload, same seed: no offloading vs the CPU pool only vs the configured stack",
    )
    table = Table()
    table.add_column("")
    for run in runs:
        table.add_column(run.label, justify="right")
    for key, values in compare_rows(runs, cost).items():
        if key in ("hit rate", "prefill saved (%)"):
            cells = [_pct(v) for v in values]
        elif key.endswith("(s)"):
            cells = [_secs(v) for v in values]
        else:
            cells = [_n(v) for v in values]
        table.add_row(key, *cells)
    console.print(table)
    console.print(
        f"prefill cost per recomputed token: {cost.seconds_per_token * 1e6:.1f} us ({cost.source})",
        highlight=False,
        soft_wrap=True,
    )


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kvtiers_bench": JSON_VERSION, **document}, indent=2, default=str))


# ---------------------------------------------------------------------- describing


def distinct_bytes(spec: Any, geometry: Any) -> int:
    """Bytes of every distinct block the workload writes."""
    return written_bytes_bound(
        spec.num_prefixes,
        spec.prefix_tokens,
        min(spec.total_sessions, 10**6),
        spec.turns,
        spec.prompt_tokens + spec.output_tokens,
        spec.block_tokens,
        geometry.block_bytes,
        0,
    )


def describe_workload(spec: Any, duration: float | None) -> str:
    count = (
        f"requests for {duration:g} s"
        if duration is not None
        else f"{spec.total_sessions:,} sessions x {spec.turns} turns = {spec.requests:,} requests"
    )
    return (
        f"{count}; {spec.num_prefixes} shared prefixes of {spec.prefix_tokens:,} tokens; "
        f"{spec.prompt_tokens} prompt + {spec.output_tokens} output tokens per turn; "
        f"{spec.sessions_in_flight} sessions in flight; seed {spec.seed}"
    )


def describe_stack(config: Any, paths: bool = True) -> str:
    """The config in one line: the pool, then each tier with its capacity."""
    parts = [
        f"CPU pool {format_bytes(config.cpu_bytes_to_use)} ({config.eviction_policy}, "
        f"{config.write_policy})"
    ]
    for t in config.secondary_tiers:
        opts = dict(t.options)
        bits = [format_bytes(opts["capacity_bytes"])] if "capacity_bytes" in opts else []
        if "root_dir" in opts and paths:
            bits.append(str(opts["root_dir"]))
        if "inner" in opts:
            bits.append(f"wrapping {opts['inner'].type}")
        parts.append(f"{t.type}" + (f" ({', '.join(bits)})" if bits else ""))
    return " -> ".join(parts)
