"""`kvtiers bench`: replay a multi-turn, shared-prefix chat workload through the real
stack (manager + DeviceSwapper + the configured tiers), moving real bytes and
checking every block loaded back; or `--model-check`: a tiny transformer's logits
are identical whether its KV stayed on the "GPU" or came back through kvtiers.

Exit status: 0 done (every loaded byte matched); 1 wrong bytes reached the GPU or
the model check failed; 2 a config or option the machine cannot honour (printed by
`kvtiers.cli.main`, one line per problem). Imports torch only when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any

from kvtiers.bench.defaults import DEFAULT_CPU_BYTES, DEFAULT_FS_BYTES, DEFAULT_WORKLOAD
from kvtiers.bench.presets import DEFAULT_GPU_TFLOPS, DEFAULT_PRESET, PRESETS
from kvtiers.errors import KvtiersError
from kvtiers.humanize import format_bytes

W = DEFAULT_WORKLOAD


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        f"Without --config: a CPU pool of {format_bytes(DEFAULT_CPU_BYTES)} and an fs tier of "
        f"{format_bytes(DEFAULT_FS_BYTES)} in a temporary directory (removed afterwards), "
        "sized for a 2-core / 24 GiB machine.\nExit status: 0 ok, 1 wrong bytes reached the "
        "GPU (or the model check failed), 2 config or options refused."
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a kvtiers config (file or inline JSON; "
        "vLLM's kv_transfer_config too); default: the built-in one",
    )
    parser.add_argument("--json", metavar="OUT", type=Path, help="write every number here")
    parser.add_argument(
        "--plot",
        metavar="OUT.png",
        type=Path,
        help="draw hit rate and throughput over time per tier (needs matplotlib: the "
        "`plot` extra of kvtiers-core)",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also run the same seed with no offloading and with the CPU pool "
        "only, side by side, with the prefill work saved",
    )
    parser.add_argument(
        "--model-check",
        action="store_true",
        help="run the tiny-transformer check instead: logits identical with KV "
        "resident, reloaded from the CPU pool, and reloaded from fs",
    )
    parser.add_argument(
        "--tmp-dir", metavar="DIR", help="where the default fs tier's temporary directory goes"
    )
    parser.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="where the stand-in GPU KV cache lives (auto: CUDA when present)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve Prometheus metrics on http://127.0.0.1:N/metrics while the bench runs "
        "(0: a free port, printed; needs the `metrics` extra of kvtiers-core)",
    )

    from kvtiers.cli.snapshot_cmd import add_storage_option

    snap = parser.add_argument_group(
        "CPU pool snapshots (zarr v3 on a directory or fsspec URL; the `snapshot` extra)")
    snap.add_argument("--snapshot-load", metavar="URL",
                      help="before the run, pre-warm the configured stack's CPU pool with "
                      "this snapshot's hottest blocks (each verified; another geometry's "
                      "is refused)")
    snap.add_argument("--snapshot-save", metavar="URL",
                      help="after the run, save the configured stack's CPU pool here, "
                      "most recently used first")
    snap.add_argument("--snapshot-hottest", type=int, metavar="N",
                      help="with --snapshot-save: only the N hottest blocks")
    add_storage_option(snap)

    wl = parser.add_argument_group("workload (same seed, same requests)")
    for flag, key, what in (
        ("--prefixes", "prefixes", "shared prefixes"),
        ("--prefix-tokens", "prefix_tokens", "tokens per shared prefix"),
        ("--prompt-tokens", "prompt_tokens", "new prompt tokens per turn"),
        ("--output-tokens", "output_tokens", "output tokens per turn"),
        ("--turns", "turns", "turns per session"),
        ("--sessions-in-flight", "sessions_in_flight", "sessions with a request in flight at once"),
    ):
        wl.add_argument(
            flag, type=int, default=W[key], metavar="N", help=f"{what} (default %(default)s)"
        )
    stop = wl.add_mutually_exclusive_group()
    stop.add_argument(
        "--sessions",
        type=int,
        default=None,
        metavar="N",
        help=f"total sessions (default {W['sessions']})",
    )
    stop.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="start requests for S seconds instead, then let them finish",
    )
    wl.add_argument(
        "--seed",
        type=int,
        default=W["seed"],
        metavar="N",
        help="workload seed (default %(default)s)",
    )

    geo = parser.add_argument_group("model geometry")
    geo.add_argument(
        "--model",
        default=DEFAULT_PRESET,
        choices=sorted(PRESETS),
        metavar="PRESET",
        help=f"geometry preset: {', '.join(PRESETS)} (default %(default)s)",
    )
    geo.add_argument("--layers", type=int, metavar="N", help="override the preset's layers")
    geo.add_argument("--kv-heads", type=int, metavar="N", help="override its kv heads")
    geo.add_argument("--head-size", type=int, metavar="N", help="override its head size")
    geo.add_argument(
        "--dtype", metavar="NAME", help="override its dtype (bfloat16, float16, float32, ...)"
    )
    geo.add_argument("--block-tokens", type=int, metavar="N", help="override its tokens per block")
    geo.add_argument(
        "--kv-layout",
        default="layer",
        choices=("layer", "cross"),
        help="the engine's KV layout: per-layer [2, pages, ...] tensors, or one "
        "cross-layer tensor (default %(default)s)",
    )
    geo.add_argument(
        "--gpu-pages",
        type=int,
        metavar="N",
        help="pages of the stand-in GPU KV cache (default: what the requests in "
        "flight need; GPU prefix reuse is off either way)",
    )

    cost = parser.add_argument_group("prefill cost (for --compare)")
    cost.add_argument(
        "--prefill-us-per-token",
        type=float,
        metavar="US",
        help="GPU microseconds per recomputed prompt token (default: estimated "
        "from the model's parameters and --gpu-tflops)",
    )
    cost.add_argument(
        "--params",
        type=float,
        metavar="N",
        help="the model's parameter count, e.g. 8e9 (default: the preset's)",
    )
    cost.add_argument(
        "--gpu-tflops",
        type=float,
        default=DEFAULT_GPU_TFLOPS,
        metavar="T",
        help="sustained TFLOP/s assumed for the estimate (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from kvtiers.cli.destinations import check_plot_destination, check_writable

    # What the run writes at its end is checked before it starts (no torch yet).
    if args.json is not None:
        check_writable(args.json, "--json")
    if args.plot is not None:
        if args.model_check:
            raise BenchRefused("--plot draws a bench run over time; --model-check has none")
        check_plot_destination(args.plot)
    if args.metrics_port is not None:
        from kvtiers.metrics.prometheus import require_prometheus

        if args.model_check:
            raise BenchRefused("--metrics-port serves a bench run's metrics; "
                               "--model-check has none")
        if not 0 <= args.metrics_port < 65536:
            raise BenchRefused(f"--metrics-port must be 0..65535, got {args.metrics_port}")
        require_prometheus("kvtiers bench --metrics-port")
    _check_snapshot_options(args)
    if args.model_check:
        _require_fs("--model-check reloads the model's KV from an fs tier (its third run)")
        from kvtiers.bench.model_check import main as model_check_main

        return model_check_main(tmp_dir=args.tmp_dir, json_out=args.json)
    from kvtiers.bench.stack import BenchError, BenchIntegrityError
    from kvtiers.errors import ConfigError

    try:
        return _bench(args)
    except ConfigError:
        # `kvtiers.cli.main` prints the problems (exit 2); say what it means here.
        print("kvtiers bench: the config is refused; nothing is shrunk to fit", file=sys.stderr)
        raise
    except BenchIntegrityError as exc:
        print(f"kvtiers bench FAILED: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise  # the reader of stdout left: `kvtiers.cli.main` stops quietly
    except (ValueError, OSError) as exc:
        raise BenchError(str(exc)) from exc


def _bench(args: argparse.Namespace) -> int:
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
            _require_fs("without --config, kvtiers bench runs a CPU pool and an fs tier")
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


def _check_snapshot_options(args: argparse.Namespace) -> None:
    """Refuse snapshot options that cannot be honoured, before any work (zarr
    missing included: an error naming the extra)."""
    if args.snapshot_hottest is not None:
        if args.snapshot_save is None:
            raise BenchRefused("--snapshot-hottest says how much --snapshot-save keeps; "
                               "give --snapshot-save too")
        if args.snapshot_hottest < 1:
            raise BenchRefused("--snapshot-hottest must be at least 1")
    if args.storage_option and args.snapshot_save is None and args.snapshot_load is None:
        raise BenchRefused("--storage-option is for --snapshot-save / --snapshot-load")
    if args.snapshot_save is None and args.snapshot_load is None:
        return
    if args.model_check:
        raise BenchRefused("--snapshot-save / --snapshot-load work on a bench run's CPU "
                           "pool; --model-check has none")
    from kvtiers.ops.snapshot_store import require_zarr
    from kvtiers.ops.storage_options import parse_storage_options

    require_zarr()
    args.storage_options = parse_storage_options(args.storage_option)
    args.snapshot_results = {}


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
                       storage_options=args.storage_options)
    args.snapshot_results["save"] = {"url": args.snapshot_save, **result.as_dict()}
    console.print(f"saved the CPU pool's {result.blocks:,} hottest blocks to "
                  f"{args.snapshot_save}")


class BenchRefused(KvtiersError):
    """An option of `kvtiers bench` that cannot be honoured, found before any work."""


def _require_fs(why: str) -> None:
    """Refuse, naming the distribution to install, when the fs tier is missing."""
    from kvtiers.config.plugin_hints import disabled_hint
    from kvtiers.plugins import get_registry
    from kvtiers.plugins.registry import install_hint

    if "fs" in get_registry().tiers:
        return
    hint = install_hint("fs") or "install the distribution that provides the fs tier"
    raise BenchRefused(
        f"{why}, and no fs tier is installed (kvtiers-core alone has the memory and faulty "
        f"tiers): {hint}"
        + ("; or pass --config with the tiers you have" if "--model-check" not in why else "")
        + disabled_hint("tier", "fs")
    )
