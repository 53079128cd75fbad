"""The `kvtiers serve` and `kvtiers p2p keygen` commands (registered by
`kvtiers_p2p.plugin`, named lazily: this module is imported only to run them)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from kvtiers.sdk import DTYPE_BYTES, BlockGeometry, Namespace


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a standalone cache node: a CPU pool (and the config's other tiers) that "
        "engines pull from and cascade into, through the config's p2p tier. The node "
        "holds one model's blocks: give its KV geometry. SIGTERM or Ctrl-C stops it "
        "cleanly (peers told, transfers ended, pins released).")
    parser.add_argument("--config", required=True,
                        help="a kvtiers config (file or inline JSON) with a p2p tier that "
                             "has a port")
    parser.add_argument("--model", help="model id (default: the config's model)")
    parser.add_argument("--revision", default="")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True)
    parser.add_argument("--head-size", type=int, required=True)
    parser.add_argument("--dtype", default="float16", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--tokens-per-block", type=int, default=16)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--status-every", type=float, default=10.0, metavar="S",
                        help="print a status line every S seconds (0: never)")
    parser.add_argument("--ready-file", type=Path,
                        help="once serving, write {\"endpoints\": [...]} here as JSON")
    parser.add_argument("--metrics-port", type=int, metavar="N",
                        help="serve Prometheus metrics on http://127.0.0.1:N/metrics while "
                        "the node runs (0: a free port, printed on stderr; needs the "
                        "`metrics` extra of kvtiers-core; docs/metrics.md)")
    parser.add_argument("--snapshot-load", metavar="URL",
                        help="before serving, pre-warm the pool with this snapshot's hottest "
                        "blocks (`kvtiers snapshot`'s zarr format, on a directory or an "
                        "fsspec URL; each block verified; another model's refused)")
    parser.add_argument("--snapshot-save", metavar="URL",
                        help="when stopped (SIGTERM, Ctrl-C), save the pool here, most "
                        "recently used first, before the node closes; URL must be absent, "
                        "empty, or a kvtiers snapshot (checked before serving)")
    parser.add_argument("--snapshot-overwrite", action="store_true",
                        help="with --snapshot-save: replace a kvtiers snapshot already "
                        "there (implied when --snapshot-load names the same URL: the node "
                        "replaces the snapshot it started from); never anything else")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an fsspec storage option of the snapshots' URLs (repeatable; "
                        "credentials better from the environment, AWS_ACCESS_KEY_ID, ...)")


def run_serve(args: argparse.Namespace) -> int:
    from kvtiers import load_config
    from kvtiers.errors import ConfigError, ConfigProblem

    from kvtiers_p2p.node.cache_node import CacheNode

    config = load_config(args.config)
    model = args.model or config.model
    if not model:
        raise ConfigError(ConfigProblem("$.model", "give --model or set model in the config"))
    try:
        geometry = BlockGeometry(args.layers, args.kv_heads, args.head_size, args.dtype,
                                 args.tokens_per_block, args.tp_size)
    except ValueError as exc:
        raise ConfigError(ConfigProblem("$", f"block geometry: {exc}")) from exc
    namespace = Namespace(model, (geometry,), args.revision)
    if args.metrics_port is not None:
        from kvtiers.metrics import require_prometheus

        if not 0 <= args.metrics_port < 65536:
            raise ConfigError(ConfigProblem(
                "--metrics-port", f"must be 0..65535, got {args.metrics_port}"))
        require_prometheus("kvtiers serve --metrics-port")
    storage_options = None
    replace = False
    if args.snapshot_overwrite and args.snapshot_save is None:
        raise ConfigError(ConfigProblem(
            "--snapshot-overwrite", "says --snapshot-save may replace a snapshot; give "
            "--snapshot-save too"))
    if args.snapshot_load is not None or args.snapshot_save is not None:
        from kvtiers.ops import (
            check_snapshot_target,
            parse_storage_options,
            require_zarr,
            same_place,
        )

        require_zarr()
        storage_options = parse_storage_options(args.storage_option)
        if args.snapshot_save is not None:
            # A node restarted with --snapshot-load X --snapshot-save X replaces the
            # snapshot it started from; any other snapshot only with
            # --snapshot-overwrite; a path holding anything else never. Checked now,
            # before serving, not at the shutdown.
            replace = args.snapshot_overwrite or (
                args.snapshot_load is not None and same_place(args.snapshot_save,
                                                              args.snapshot_load))
            check_snapshot_target(args.snapshot_save, storage_options, overwrite=replace,
                                  flag="--snapshot-overwrite")
    # A flag, not a threading.Event: the handler runs in the main thread between
    # two bytecodes, possibly while that thread holds the Event's own lock inside
    # `wait` (a signal delivered to another thread is handled when the main thread
    # next runs Python) - `set` would then wait for that lock forever.
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        recorder = None
        if args.metrics_port is not None:
            from kvtiers.metrics import MetricsRecorder

            recorder = MetricsRecorder()
        node = CacheNode(config, namespace, metrics=recorder)
        metrics = None
        try:
            if recorder is not None:
                metrics = _serve_metrics(node, config, recorder, args.metrics_port)
            out = sys.stdout
            if args.snapshot_load is not None:
                print(_snapshot_load(node, args.snapshot_load, storage_options), file=out,
                      flush=True)
            print(f"kvtiers serve: {namespace} on {', '.join(node.endpoints)}; pool "
                  f"{node.pool.num_slots} blocks of {geometry.block_bytes} bytes", file=out,
                  flush=True)
            if args.ready_file is not None:
                _write_ready(args.ready_file, node.endpoints)
            last = time.monotonic()
            while not stopping:
                node.step()
                time.sleep(0.01)  # after a signal: its handler, then the rest of this
                if args.status_every and time.monotonic() - last >= args.status_every:
                    last = time.monotonic()
                    print(f"kvtiers serve: {node.status()}", file=out, flush=True)
            print(f"kvtiers serve: stopping ({node.status()})", file=out, flush=True)
            if args.snapshot_save is not None:
                print(_snapshot_save(node, args.snapshot_save, storage_options, replace),
                      file=out, flush=True)
        finally:
            node.close()
            if metrics is not None:
                metrics.close()
        print("kvtiers serve: stopped", flush=True)
        return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _serve_metrics(node: Any, config: Any, recorder: Any, port: int) -> Any:
    """The node's manager metered (`MeteredManager`: its calls timed unless the
    config's `metrics.scheduler_call_timing` is off, its stats published from
    `step`; the node built its tiers reporting to `recorder`), served on `port`; the
    server, to close."""
    from kvtiers.metrics import MeteredManager, MetricsExporter

    node.manager = MeteredManager(node.manager, recorder,
                                  call_timing=config.metrics.scheduler_call_timing)
    server = MetricsExporter(recorder).serve(port)
    print(f"metrics: {server.url}", file=sys.stderr, flush=True)
    return server


def _snapshot_load(node: Any, url: str, options: dict[str, Any] | None) -> str:
    """Pre-warm the node's pool from `url` (`kvtiers.ops.pool_snapshot`)."""
    from kvtiers.ops import SnapshotReader, load_pool

    result = load_pool(node.manager, node.pool.view, node.namespace,
                       SnapshotReader(url, storage_options=options))
    node.manager.step()
    bad = f", {len(result.bad)} failed their checksum (skipped)" if result.bad else ""
    return f"kvtiers serve: pre-warmed the pool with {result.blocks} blocks from {url}{bad}"


def _snapshot_save(node: Any, url: str, options: dict[str, Any] | None,
                   overwrite: bool) -> str:
    from kvtiers.ops import save_pool

    result = save_pool(node.manager, node.pool.view, node.namespace, url,
                       storage_options=options, overwrite=overwrite)
    return f"kvtiers serve: saved the pool's {result.blocks} blocks to {url}"


def add_p2p_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="p2p_command", metavar="COMMAND", required=True)
    keygen = sub.add_parser("keygen", help="make a CURVE key pair for p2p peers",
                            description="Write NAME.key (public) and NAME.key_secret "
                                        "(secret, mode 0600) into DIRECTORY.")
    keygen.add_argument("directory", type=Path)
    keygen.add_argument("--name", default="kvtiers-p2p")


def run_p2p(args: argparse.Namespace) -> int:
    from kvtiers_p2p.wire.security import keygen

    public, secret = keygen(args.directory, args.name)
    print(f"public key: {public} (give it to the servers' allowed_keys_dir, or to the "
          f"pullers as server_public_key_file)\nsecret key: {secret} (mode 0600; "
          "secret_key_file of this side's curve section)")
    return 0


def _write_ready(path: Path, endpoints: list[str]) -> None:
    """`--ready-file`: the endpoints as JSON, put in place whole (readers never see a
    partial file) from a temporary of a fresh name beside it, so no file of the
    user's is overwritten but the one named."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"endpoints": endpoints}))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
