"""`kvtiers bench --engine hf`: the options, the run, the tables and the JSON.

The run: for each KV layout, time to first token per prompt size (`ttft`), then the
multi-turn workload (`multiturn`) three times with the same seed: without kvtiers,
with the CPU pool only, with the CPU pool and an fs tier. Exit status 0 when every
reload gave logits bit-identical to the same pages kept resident, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from kvtiers.bench.hf.presets import HF_PRESETS
from kvtiers.errors import KvtiersError

ENGINES = ("stand-in", "hf")
DEFAULT_TTFT_TOKENS = "2048,8192,32768,65536"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--engine` option and the hf engine's own group (no torch imported)."""
    parser.add_argument(
        "--engine", default="stand-in", choices=ENGINES,
        help="stand-in: replay the workload over a stand-in KV cache with an estimated "
        "prefill cost (default); hf: a real transformers decoder (random weights, no "
        "download) whose paged KV cache goes through kvtiers, timed per request "
        "(needs transformers)")
    hf = parser.add_argument_group(
        "real model (--engine hf; the workload options above shape its multi-turn run, "
        "--sessions defaulting to 24 here; --kv-layout its layout, --device where it runs)")
    hf.add_argument("--hf-model", default="llama3-8b", choices=sorted(HF_PRESETS),
                    help="decoder shape: " + "; ".join(p.describe() for p in
                                                        HF_PRESETS.values()))
    hf.add_argument("--hf-dtype", metavar="NAME", help="override the preset's dtype")
    hf.add_argument("--ttft-tokens", default=DEFAULT_TTFT_TOKENS, metavar="N,N,...",
                    help="prompt sizes timed against recompute (default %(default)s; "
                    "empty: skip)")
    hf.add_argument("--rest-tokens", type=int, default=128, metavar="N",
                    help="new tokens of the timed turn, prefilled after a reload "
                    "(default %(default)s)")
    hf.add_argument("--reps", type=int, default=3, metavar="N",
                    help="timed repetitions per case, median taken, after one warm-up "
                    "(default %(default)s)")
    hf.add_argument("--ttft-layouts", default="layer,cross", metavar="L,L",
                    help="KV layouts timed (default %(default)s)")
    hf.add_argument("--no-multiturn", action="store_true", help="skip the multi-turn run")
    hf.add_argument("--hf-pool-bytes", type=int, metavar="N",
                    help="CPU pool of the multi-turn run (default: half its working set, "
                    "so the fs tier serves hits)")


class HfOptionError(KvtiersError):
    """An option of `kvtiers bench` that the hf engine does not honour."""


# Options of the stand-in replay that mean nothing to the hf engine: refused, not ignored.
_STAND_IN_ONLY = (("model_check", "--model-check"), ("compare", "--compare"),
                  ("plot", "--plot"), ("config", "--config"), ("metrics_port", "--metrics-port"),
                  ("duration", "--duration"), ("snapshot_load", "--snapshot-load"),
                  ("snapshot_save", "--snapshot-save"), ("gpu_pages", "--gpu-pages"))


def check_options(args: argparse.Namespace) -> None:
    given = [flag for attr, flag in _STAND_IN_ONLY if getattr(args, attr, None) not in
             (None, False)]
    if given:
        raise HfOptionError(
            f"{', '.join(given)} belong to the stand-in replay; --engine hf runs its own "
            "stacks (a CPU pool, and an fs tier in --tmp-dir) and times them: drop "
            f"{'it' if len(given) == 1 else 'them'}")
    for flag, value in (("--rest-tokens", args.rest_tokens), ("--reps", args.reps)):
        if value < 1:
            raise HfOptionError(f"{flag} must be at least 1, got {value}")
    try:
        HF_PRESETS[args.hf_model].with_dtype(args.hf_dtype)
    except ValueError as exc:
        raise HfOptionError(f"--hf-dtype: {exc}") from None
    page = HF_PRESETS[args.hf_model].page_tokens
    off_grid = [n for n in _ints(args.ttft_tokens) if n % page or n <= args.rest_tokens]
    if off_grid or args.rest_tokens % page:
        raise HfOptionError(
            f"--ttft-tokens and --rest-tokens must be multiples of the page size ({page}), "
            f"each prompt longer than --rest-tokens ({args.rest_tokens}); refused: "
            + ", ".join(map(str, off_grid or [args.rest_tokens])))
    bad = [x for x in args.ttft_layouts.split(",") if x and x not in ("layer", "cross")]
    if bad:
        raise HfOptionError(f"--ttft-layouts takes layer and/or cross, got {', '.join(bad)}")


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HfOptionError(f"--ttft-tokens takes comma-separated token counts, got {text!r}"
                            ) from None


def run(args: argparse.Namespace) -> int:
    check_options(args)
    import torch

    from kvtiers.bench.defaults import default_root
    from kvtiers.bench.hf import multiturn, ttft
    from kvtiers.bench.hf.decoder import HfDecoder
    from kvtiers.bench.hf.limits import DiskProbe
    from kvtiers.bench.model_check import deterministic
    from kvtiers.bench.report import machine_info
    from kvtiers.bench.stack import pick_device

    preset = HF_PRESETS[args.hf_model].with_dtype(args.hf_dtype)
    device = pick_device(args.device)
    sizes = _ints(args.ttft_tokens)
    layouts = [x for x in args.ttft_layouts.split(",") if x]
    t = preset.page_tokens
    block = preset.geometry().block_bytes
    slot = -(-block // 4096) * 4096
    w = multiturn.Workload(
        sessions=args.sessions or 24, prefixes=args.prefixes, prefix_tokens=args.prefix_tokens,
        turns=args.turns, user_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
        concurrency=args.sessions_in_flight, seed=args.seed)
    ws_bytes = -(-w.working_set_tokens() // t) * slot
    pool_bytes = args.hf_pool_bytes or max(16 * slot, ws_bytes // 2 // slot * slot)
    ttft_fs = sum(n // t for n in sizes) * (block + 8192) * 11 // 10  # one layout's
    probe_bytes = max(sizes, default=0) // t * block  # the disk probe: the largest hit's
    mt_fs = 0 if args.no_multiturn else 2 * ws_bytes
    out: dict[str, Any] = {
        "what": "kvtiers bench --engine hf",
        "command": "kvtiers bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if len(sys.argv) > 1 and sys.argv[1] == "bench" else shlex.join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _machine(machine_info(), device),
        "model": preset.describe(),
    }
    print(f"kvtiers bench --engine hf: {preset.describe()}")
    print(f"  machine  {out['machine'].get('gpu') or 'CPU'}; torch {torch.__version__}, "
          f"transformers {out['machine']['transformers']}")
    ok = True
    # On the CPU (CI), one thread and deterministic algorithms, as the model check.
    ctx = deterministic(threads=1) if device.type == "cpu" else contextlib.nullcontext()
    with ctx, default_root(args.tmp_dir, ttft_fs + probe_bytes + mt_fs) as root:
        decoder = HfDecoder(preset, device, seed=args.seed)
        if sizes:
            probe = DiskProbe(root, probe_bytes) if "fs" in _tiers() else None
            disk = probe.read() if probe is not None else None
            cases = []
            for layout in layouts:
                fs_root = os.path.join(root, f"ttft-{layout}")  # removed after the layout
                os.makedirs(fs_root)
                cfg = {"cpu_bytes_to_use": (max(sizes) // t + 8) * slot,
                       "secondary_tiers": [{"type": "fs", "root_dir": fs_root,
                                            "capacity_bytes": ttft_fs, "shared": False}]}
                pages = 2 * (max(sizes) // t) + args.rest_tokens // t + 8
                tr = ttft.TtftRun(decoder, preset, layout, pages, cfg, args.reps, args.seed,
                                  probe)
                try:
                    for i, n in enumerate(sizes):
                        case = tr.measure(n, args.rest_tokens, control=i == 0)
                        cases.append(case)
                        _print_case(case, disk)
                finally:
                    tr.close()
                    _free(device)
                    shutil.rmtree(fs_root, ignore_errors=True)
            if probe is not None:
                probe.close()
            ok &= all(c.identical_pool and c.identical_fs is not False
                      and c.identical_partial is not False and c.control_differs is not False
                      for c in cases)
            run_gbps = ttft.run_disk_gbps(cases, disk)
            out["ttft"] = {"rest_tokens": args.rest_tokens, "reps": args.reps,
                           "disk_read": disk.as_dict() if disk else None,
                           "disk_run_GBps": run_gbps, "fs_run_GBps": ttft.run_fs_gbps(cases),
                           "cases": [c.as_dict(disk, run_gbps) for c in cases]}
            _print_ttft(cases, disk, run_gbps, ttft.run_fs_gbps(cases))
        if not args.no_multiturn:
            fs_root = os.path.join(root, "multiturn")
            os.makedirs(fs_root, exist_ok=True)
            modes: list[tuple[str, dict[str, Any] | None]] = [
                ("recompute (no kvtiers)", None),
                ("kvtiers: CPU pool only", {"cpu_bytes_to_use": pool_bytes}),
                ("kvtiers: CPU pool + fs", {"cpu_bytes_to_use": pool_bytes, "secondary_tiers": [
                    {"type": "fs", "root_dir": fs_root, "capacity_bytes": mt_fs,
                     "shared": False}]}),
            ]
            results = []
            for name, mode_cfg in modes:
                r = multiturn.run_multiturn(decoder, preset, args.kv_layout, w, name, mode_cfg)
                _free(device)
                results.append(r)
            out["multiturn"] = {"workload": asdict(w), "layout": args.kv_layout,
                                "pool_bytes": pool_bytes, "working_set_bytes": ws_bytes,
                                "results": [dict(r.summary(), kvtiers_stats=r.kvtiers_stats)
                                            for r in results]}
            _print_multiturn(w, results, pool_bytes, ws_bytes)
    out["ok"] = ok
    print("reloads: logits bit-identical to the same pages kept resident: "
          + ("yes, every one" if ok else "NO - FAILED"))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str))
        print(f"wrote {args.json}")
    sys.stdout.flush()
    return 0 if ok else 1


def _machine(info: dict[str, Any], device: Any) -> dict[str, Any]:
    import transformers

    info["transformers"] = transformers.__version__
    info["device"] = str(device)
    return info


def _tiers() -> set[str]:
    from kvtiers.plugins import get_registry

    return set(get_registry().tiers)


def _free(device: Any) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.1f}"


def _print_case(c: Any, disk: Any) -> None:
    s = c.summary(disk)
    print(f"  {c.layout:5} {c.tokens:>6} tokens: recompute {_ms(s['recompute_s'])} ms, "
          f"pool hit {_ms(s['pool_hit_s'])} ms ({s['gain']:.1f}x; copy limit "
          f"{s['limit_gain']:.1f}x), fs hit {_ms(s.get('fs_hit_s'))} ms", flush=True)


def _print_ttft(cases: list[Any], disk: Any, run_gbps: float | None = None,
                fs_gbps: float | None = None) -> None:
    print("\nTTFT (ms, median): recompute vs. reload through kvtiers; limit = pinned copy of "
          "the same bytes + prefill of the rest, measured in this run")
    if disk is not None:
        print(f"disk: {disk.tool} O_DIRECT 2 MiB read of {disk.nbytes / 1e9:.2f} GB at "
              f"{disk.gbps:.2f} GB/s at the start; then the same reads of each row's KV "
              "bytes, one right before each fs hit ('row disk GB/s': their median). Every "
              "read is of cold data: a file on the fs tier's filesystem whose bytes were just "
              "overwritten, synced, and not read since")
    if run_gbps is not None:
        print(f"fs/disk limit: the fs hit against the KV bytes at the disk's speed over the "
              f"run ({run_gbps:.2f} GB/s: bytes / seconds of all those reads) + prefill of "
              f"the rest; the fs tier promoted at {fs_gbps or 0:.2f} GB/s over the run (all "
              "fs hits); fs/row: against the row's own reads instead")
    head: tuple[str, ...] = ("layout", "tokens", "KV GB", "recompute", "pool hit", "gain", "limit",
            "limit gain", "share", "fs hit", "fs/disk limit", "fs/row", "fs GB/s",
            "row disk GB/s", "partial (gain)")
    rows: list[tuple[str, ...]] = []
    for c in cases:
        s = c.summary(disk, run_gbps)
        rows.append((c.layout, f"{c.tokens:,}", f"{c.kv_bytes / 1e9:.2f}",
                     _ms(s["recompute_s"]), _ms(s["pool_hit_s"]), f"{s['gain']:.1f}x",
                     _ms(s["copy_limit_s"]), f"{s['limit_gain']:.1f}x",
                     f"{100 * s['share_of_limit_gain']:.0f} %", _ms(s.get("fs_hit_s")),
                     f"{s['fs_over_disk_limit']:.2f}x" if s.get("fs_over_disk_limit") else "-",
                     f"{s['fs_over_row_disk_limit']:.2f}x" if s.get("fs_over_row_disk_limit")
                     else "-",
                     f"{s['fs_read_GBps']:.2f}" if s.get("fs_read_GBps") else "-",
                     f"{s['disk_GBps']:.2f}" if s.get("disk_GBps") else "-",
                     f"{_ms(s.get('partial_hit_s'))} ({s.get('partial_gain', 0):.1f}x)"))
    _table(head, rows)
    print("\nwhere a hit's time goes (ms; the median run; fs: blocks are swapped in as their "
          "promotions land - 'swap-in' is what is left after the last one, 'early' the "
          "blocks already swapped in by then, 'swap GB/s' the rate of the rest)")
    head = ("layout", "tokens", "hit", "hash", "lookup", "promotion", "early", "swap-in",
            "swap GB/s", "prefill rest", "total")
    rows = []
    for c in cases:
        pool = sorted(c.pool_hits, key=lambda b: b.total_s)[len(c.pool_hits) // 2]
        for name, b in (("pool", pool), ("fs", c.fs_hit), ("partial", c.partial)):
            if b is None:
                continue
            late = (b.hit_blocks - b.early_blocks) * c.block_bytes  # swapped in after
            rows.append((c.layout, f"{c.tokens:,}", name, _ms(b.hash_s), _ms(b.lookup_s),
                         _ms(b.promote_s), f"{b.early_blocks:,}", _ms(b.swap_in_s),
                         f"{late / b.swap_in_s / 1e9:.1f}" if b.swap_in_s and late else "-",
                         _ms(b.prefill_s), _ms(b.total_s)))
    _table(head, rows)
    print("bit-identical to resident: " + ", ".join(
        f"{c.layout}/{c.tokens}: pool {c.identical_pool}, fs {c.identical_fs}, partial "
        f"{c.identical_partial}" for c in cases))
    print("max |logits| difference, reload vs full recompute (bf16 kernels differ by "
          "chunking): " + ", ".join(f"{c.layout}/{c.tokens}: {c.max_abs_vs_recompute:.3g} "
                                     f"(|logit| <= {c.max_abs_logit:.3g})"
                                     for c in cases))
    controls = [c.control_differs for c in cases if c.control_differs is not None]
    print(f"control (pages scrambled, not reloaded -> logits differ): {all(controls)}")


def _print_multiturn(w: Any, results: list[Any], pool_bytes: int, ws_bytes: int) -> None:
    print(f"\nmulti-turn: {w.sessions} sessions x {w.turns} turns, {w.prefixes} shared "
          f"prefixes of {w.prefix_tokens:,} tokens, {w.user_tokens} new + {w.output_tokens} "
          f"generated tokens per turn, {w.concurrency} sessions in flight, seed {w.seed}; "
          f"CPU pool {pool_bytes / 1e9:.2f} GB for a working set of {ws_bytes / 1e9:.2f} GB")
    head: tuple[str, ...] = ("mode", "wall s", "tokens/s", "prompt tok/s", "gen tok/s",
                             "TTFT p50 ms", "TTFT p90 ms", "from pool", "from fs", "recomputed",
                             "vs recompute")
    base = results[0].summary()["tokens_per_s"]
    rows: list[tuple[str, ...]] = []
    for r in results:
        s = r.summary()
        rows.append((r.mode, f"{s['wall_s']:.1f}", f"{s['tokens_per_s']:,.0f}",
                     f"{s['prompt_tokens_per_s']:,.0f}", f"{s['generated_tokens_per_s']:,.0f}",
                     _ms(s["ttft_p50_s"]), _ms(s["ttft_p90_s"]),
                     f"{100 * s['hit_rate_pool']:.1f} %", f"{100 * s['hit_rate_fs']:.1f} %",
                     f"{100 * s['recomputed_share']:.1f} %", f"{s['tokens_per_s'] / base:.2f}x"))
    _table(head, rows)
    print("where the engine loop's time went (s, summed; waiting requests let others run)")
    head = ("mode", "lookups", "swap-in", "prefill (not found)", "decode", "requests deferred")
    rows = [(r.mode, f"{r.lookup_s:.2f}", f"{r.swap_in_s:.2f}", f"{r.prefill_s:.2f}",
             f"{r.decode_s:.2f}", str(r.deferred_requests)) for r in results]
    _table(head, rows)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    print("| " + " | ".join(h.ljust(n) for h, n in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (n + 2) for n in widths) + "|")
    for r in rows:
        print("| " + " | ".join(x.rjust(n) for x, n in zip(r, widths, strict=True)) + " |")
