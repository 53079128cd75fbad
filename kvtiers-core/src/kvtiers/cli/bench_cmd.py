"""`kvtiers bench`: replay a multi-turn, shared-prefix chat workload through the real
stack (manager + DeviceSwapper + the configured tiers), moving real bytes and
checking every block loaded back; or `--model-check`: a tiny transformer's logits
are identical whether its KV stayed on the "GPU" or came back through kvtiers.

Exit status: 0 done (every loaded byte matched); 1 wrong bytes reached the GPU or
the model check failed; 2 a config or option the machine cannot honour (printed by
`kvtiers.cli.main`, one line per problem). Imports torch only when it runs.

This module is the command line: the options, and the checks that refuse what
cannot be honoured before any work; the run itself is `kvtiers.bench.orchestrate`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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

    from kvtiers.bench.hf.run import add_arguments as add_hf_arguments
    from kvtiers.cli.snapshot_cmd import add_storage_option

    add_hf_arguments(parser)

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
    snap.add_argument("--snapshot-overwrite", action="store_true",
                      help="with --snapshot-save: replace a kvtiers snapshot already there "
                      "(implied when --snapshot-load names the same URL); a path holding "
                      "anything else is refused, before the run, with or without it")
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
    if args.engine == "hf":
        _require_fs("--engine hf times fs hits and runs a CPU pool + fs stack")
        from kvtiers.bench.hf.run import run as run_hf

        return run_hf(args)
    if args.model_check:
        _require_fs("--model-check reloads the model's KV from an fs tier (its third run)")
        from kvtiers.bench.model_check import main as model_check_main

        return model_check_main(tmp_dir=args.tmp_dir, json_out=args.json)
    if args.config is None:
        _require_fs("without --config, kvtiers bench runs a CPU pool and an fs tier")
    from kvtiers.bench.stack import BenchError, BenchIntegrityError
    from kvtiers.errors import ConfigError

    try:
        from kvtiers.bench.orchestrate import run_bench

        return run_bench(args)
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


def _check_snapshot_options(args: argparse.Namespace) -> None:
    """Refuse snapshot options that cannot be honoured, before any work (zarr
    missing included: an error naming the extra)."""
    if args.snapshot_hottest is not None:
        if args.snapshot_save is None:
            raise BenchRefused("--snapshot-hottest says how much --snapshot-save keeps; "
                               "give --snapshot-save too")
        if args.snapshot_hottest < 1:
            raise BenchRefused("--snapshot-hottest must be at least 1")
    if args.snapshot_overwrite and args.snapshot_save is None:
        raise BenchRefused("--snapshot-overwrite says --snapshot-save may replace a "
                           "snapshot; give --snapshot-save too")
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
    if args.snapshot_save is not None:
        from kvtiers.ops.snapshot_target import check_target, same_place

        # The run's own snapshot (--snapshot-load names the same URL) is replaced
        # without asking; any other only with --snapshot-overwrite; a path holding
        # anything but a kvtiers snapshot never. Checked now, before the run.
        args.snapshot_replace = args.snapshot_overwrite or (
            args.snapshot_load is not None and same_place(args.snapshot_save,
                                                          args.snapshot_load))
        check_target(args.snapshot_save, args.storage_options,
                     overwrite=args.snapshot_replace, flag="--snapshot-overwrite")


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
