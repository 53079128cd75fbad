"""What `kvtiers bench` does once its options are checked (`kvtiers.cli.bench_cmd`):
build the workload and the stacks it compares, replay each one, serve its metrics,
pre-warm from and save a pool snapshot, and report (table, JSON, plot).

Main thread only; imports torch (through the stack) when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Any

from kvtiers.bench.defaults import DEFAULT_FS_BYTES, DEFAULT_WORKLOAD
from kvtiers.humanize import format_bytes

W = DEFAULT_WORKLOAD


def run_bench(args: argparse.Namespace) -> int:
    """Run the bench `args` (checked by `kvtiers.cli.bench_cmd`) asks for: its runs,
    their report, the JSON and the plot; 0 when every loaded byte matched. Raises
    `ConfigError` for a refused config, `BenchIntegrityError` for wrong bytes."""
    from rich.console import Console

    from kvtiers.bench import report
    from kvtiers.bench.defaults import default_document, default_root, written_bytes_bound
    from kvtiers.bench.presets import PrefillCost, geometry_from
    from kvtiers.bench.workload import WorkloadSpec
    from kvtiers.config import load_config
    from kvtiers.config.redact import redact_config
    from kvtiers.plugins import get_registry

    geometry = geometry_from(
        args.model,
        layers=args.layers,
        kv_heads=args.kv_heads,
        head_size=args.head_size,
        dtype=args.dtype,
        block_tokens=args.block_tokens,
        params=args.params,
    )
    sessions = args.sessions if args.sessions is not None else W["sessions"]
    if args.duration is not None:
        if args.duration <= 0:
            raise ValueError("--duration must be positive")
        sessions = 10**9  # the clock stops the run
    spec = WorkloadSpec(
        num_prefixes=args.prefixes,
        prefix_tokens=args.prefix_tokens,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        turns=args.turns,
        sessions_in_flight=args.sessions_in_flight,
        total_sessions=sessions,
        block_tokens=geometry.block_tokens,
        seed=args.seed,
    )
    cost = (
        PrefillCost.given(args.prefill_us_per_token)
        if args.prefill_us_per_token is not None
        else PrefillCost.estimate(geometry, args.gpu_tflops)
    )
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    bound = written_bytes_bound(
        spec.num_prefixes,
        spec.prefix_tokens,
        min(sessions, 10**6),
        spec.turns,
        spec.prompt_tokens + spec.output_tokens,
        geometry.block_tokens,
        geometry.block_bytes,
    )
    with contextlib.ExitStack() as stack:
        if args.config is None:
            root = stack.enter_context(default_root(args.tmp_dir, min(bound, DEFAULT_FS_BYTES)))
            config = load_config(default_document(root))
            source = f"built-in default (fs tier in {root}, removed afterwards)"
        else:
            config = load_config(args.config)
            source = config.source
        for warning in config.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        for note in config.notes:  # such as a capacity derived for a vLLM config
            print(f"note: {note}", file=sys.stderr)
        runs = _runs(args, config, geometry, spec, console, source)
        main = runs[-1]
        for i, run_ in enumerate(runs):
            if i:
                console.print()
            report.print_run(console, run_, [f"[bold]{run_.label}[/bold]"] if len(runs) > 1 else [])
        if args.compare:
            console.print()
            report.print_compare(console, runs, cost)
        if args.json:
            report.write_json(
                args.json,
                {
                    "command": " ".join(["kvtiers", *sys.argv[1:]])
                    if sys.argv
                    else "kvtiers bench",
                    "machine": report.machine_info(),
                    "config_source": source,
                    "config": redact_config(config.to_dict(), get_registry()),
                    "geometry": geometry.as_dict(),
                    "workload": {
                        **dataclasses.asdict(spec),
                        "hash_seed": str(spec.hash_seed),
                        "duration_s": args.duration,
                    },
                    "prefill_cost": cost.as_dict(),
                    "result": main.as_dict(),
                    "compare": ([r.as_dict() for r in runs] if args.compare else None),
                    "compare_rows": report.compare_rows(runs, cost) if args.compare else None,
                    "snapshot": getattr(args, "snapshot_results", None),
                },
            )
            console.print(f"wrote {args.json}")
        if args.plot:
            from kvtiers.bench.plot import PlotUnavailable, write_plot

            try:
                stack_line = report.describe_stack(config, paths=False)
                title = f"kvtiers bench, {geometry.name} ({main.stand_in['device']}): {stack_line}"
                write_plot(args.plot, main, title)
            except PlotUnavailable as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            console.print(f"wrote {args.plot}")
    return 0


def _runs(
    args: argparse.Namespace,
    config: Any,
    geometry: Any,
    spec: Any,
    console: Any,
    source: str,
) -> list[Any]:
    from kvtiers.bench import report
    from kvtiers.bench.engine import pages_for
    from kvtiers.bench.stack import pick_device

    device = pick_device(args.device)
    pages = args.gpu_pages or pages_for(
        spec.sessions_in_flight,
        spec.prefix_tokens,
        spec.prompt_tokens,
        spec.output_tokens,
        spec.turns,
        spec.block_tokens,
    )
    plans: list[tuple[str, Any]] = []
    if args.compare:
        plans += [
            ("no offloading", None),
            ("CPU pool only", dataclasses.replace(config, secondary_tiers=())),
        ]
    plans.append(("configured stack", config))
    machine = report.machine_info()
    distinct = report.distinct_bytes(spec, geometry)
    console.print(f"[bold]kvtiers bench[/bold]: {source}")
    for line in (
        f"  machine   {report.describe_machine(machine)}",
        f"  model     {geometry.describe()}",
        f"  workload  {report.describe_workload(spec, args.duration)}",
        f"  stack     {report.describe_stack(config)}",
        f"  GPU       stand-in paged KV cache on {device}: {pages:,} pages "
        f"({format_bytes(pages * geometry.block_bytes)}, {args.kv_layout} layout) for the "
        f"requests in flight; the workload's distinct blocks total ~{format_bytes(distinct)}; "
        "GPU prefix reuse off: every reuse goes through kvtiers",
    ):
        console.print(line, highlight=False, soft_wrap=True)
    results = []
    with contextlib.ExitStack() as scope:
        recorder = _serve_metrics(args.metrics_port, scope)
        for label, cfg in plans:
            results.append(_run_one(args, label, cfg, spec, geometry, pages, device, console,
                                    recorder))
    return results


def _serve_metrics(port: int | None, scope: contextlib.ExitStack) -> Any:
    """The recorder every run reports to, served on `port` until `scope` ends; None
    without --metrics-port."""
    if port is None:
        return None
    from kvtiers.metrics.prometheus import MetricsExporter
    from kvtiers.metrics.recorder import MetricsRecorder

    recorder = MetricsRecorder()
    server = MetricsExporter(recorder).serve(port)
    scope.callback(server.close)
    print(f"metrics: {server.url}", file=sys.stderr, flush=True)
    return recorder


def _run_one(
    args: argparse.Namespace, label: str, cfg: Any, spec: Any, geometry: Any, pages: int,
    device: Any, console: Any, recorder: Any,
) -> Any:
    from kvtiers.bench.progress import progress_bar
    from kvtiers.bench.runner import Replay
    from kvtiers.bench.stack import build_stack

    stack = build_stack(cfg, geometry, pages, device=device, kv_layout=args.kv_layout,
                        metrics=recorder)
    # Snapshots are the configured stack's (the last plan), not --compare's others.
    snapshots = (label == "configured stack" and stack.manager is not None
                 and getattr(args, "snapshot_results", None) is not None)
    max_wait_s = (cfg.job_timeout_s + 1.0) if cfg is not None else 0.0
    if recorder is not None and stack.manager is not None:
        from kvtiers.metrics.instrument import MeteredManager

        stack.manager = MeteredManager(  # type: ignore[assignment]
            stack.manager, recorder, call_timing=cfg.metrics.scheduler_call_timing)
    try:
        if snapshots and args.snapshot_load is not None:
            _snapshot_load(args, stack, geometry, console, max(60.0, 4 * max_wait_s))
        with progress_bar(
            not args.no_progress and sys.stdout.isatty(), spec, args.duration, label, console
        ) as update:
            replay = Replay(
                stack,
                spec,
                label=label,
                duration_s=args.duration,
                progress=update,
                max_wait_s=max_wait_s,
            )
            result = replay.run()
        if snapshots and args.snapshot_save is not None:
            _snapshot_save(args, stack, geometry, console)
        return result
    finally:
        stack.close()


def _snapshot_load(args: argparse.Namespace, stack: Any, geometry: Any, console: Any,
                   timeout_s: float) -> None:
    """Pre-warm the stack's pool from --snapshot-load, its copies down drained."""
    from kvtiers.bench.stack import BenchError, bench_namespace
    from kvtiers.ops.pool_snapshot import load_pool
    from kvtiers.ops.snapshot_store import SnapshotReader

    reader = SnapshotReader(args.snapshot_load, storage_options=args.storage_options)
    result = load_pool(stack.manager, stack.pool.view, bench_namespace(geometry), reader)
    stack.manager.drain(timeout_s)
    args.snapshot_results["load"] = {"url": args.snapshot_load, **result.as_dict()}
    console.print(f"  snapshot  pre-warmed the CPU pool with {result.blocks:,} blocks from "
                  f"{args.snapshot_load}" + (f" ({len(result.bad)} failed their checksum, "
                                             "skipped)" if result.bad else ""))
    if result.bad:
        raise BenchError(f"--snapshot-load: {len(result.bad)} block(s) of "
                         f"{args.snapshot_load} fail their checksum")


def _snapshot_save(args: argparse.Namespace, stack: Any, geometry: Any, console: Any) -> None:
    from kvtiers.bench.stack import bench_namespace
    from kvtiers.ops.pool_snapshot import save_pool

    result = save_pool(stack.manager, stack.pool.view, bench_namespace(geometry),
                       args.snapshot_save, hottest=args.snapshot_hottest,
                       storage_options=args.storage_options,
                       overwrite=getattr(args, "snapshot_replace", False))
    args.snapshot_results["save"] = {"url": args.snapshot_save, **result.as_dict()}
    console.print(f"saved the CPU pool's {result.blocks:,} hottest blocks to "
                  f"{args.snapshot_save}")
