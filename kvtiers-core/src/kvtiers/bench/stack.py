"""The real stack a bench run drives: a CPU pool, the manager and its secondary tiers
(built from a validated config, as an engine would), a `DeviceSwapper` and the
stand-in GPU KV cache. Sizes are checked against the machine before anything is
allocated; nothing is ever shrunk to fit."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from kvtiers.bench.engine import StandInKV
from kvtiers.bench.presets import ModelGeometry
from kvtiers.config.model import KvtiersConfig
from kvtiers.contract.metrics import MetricsSink
from kvtiers.contract.namespace import Namespace
from kvtiers.errors import KvtiersError
from kvtiers.extras import BENCH_EXTRA, missing_torch
from kvtiers.humanize import format_bytes
from kvtiers.manager import TieringOffloadingManager
from kvtiers.manager.build import build_manager, tier_names
from kvtiers.pool import CpuPool, pool_shape
from kvtiers.pool.memory import memory_limits
from kvtiers.swap import DeviceSwapper

try:
    import torch
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc

# Blocks written by the bench hold bench content, never a model's KV: they get a
# namespace of their own, so a persistent tier shared with an engine keeps them apart.
BENCH_MODEL = "kvtiers-bench"
CONTENT_VERSION = "content-v1"


class BenchError(KvtiersError):
    """The bench cannot run as asked (too big for this machine, a bad option)."""


class BenchIntegrityError(KvtiersError):
    """A block loaded into the GPU does not hold the bytes stored for its key."""


def bench_namespace(geometry: ModelGeometry) -> Namespace:
    return Namespace(BENCH_MODEL, (geometry.block_geometry(),), revision=CONTENT_VERSION)


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: this machine has no CUDA device")
    return device


@dataclass
class Stack:
    kv: StandInKV
    pool: CpuPool | None = None
    manager: TieringOffloadingManager | None = None
    swapper: DeviceSwapper | None = None
    tier_names: tuple[str, ...] = ()

    def close(self) -> None:
        """Swapper first (its copies touch the pool), then the tiers, then the pool."""
        if self.swapper is not None:
            self.swapper.close()
        if self.manager is not None:
            self.manager.close()
        if self.pool is not None:
            self.pool.close()


def check_memory(
    config: KvtiersConfig | None, geometry: ModelGeometry, gpu_pages: int, device: torch.device
) -> dict[str, Any]:
    """Refuse (BenchError) a run whose memory the machine does not have now: the CPU
    pool plus, without CUDA, the stand-in GPU cache. Returns the sizes."""
    kv_bytes = geometry.block_bytes * gpu_pages
    pool_bytes = 0
    if config is not None:
        slot_bytes, slots = pool_shape(geometry.block_bytes, config.cpu_bytes_to_use)
        pool_bytes = slot_bytes * slots
    host = pool_bytes + (kv_bytes if device.type == "cpu" else 0)
    limits = memory_limits()
    budget = limits.available if limits.cgroup is None else min(limits.available, limits.cgroup)
    if host > budget:
        parts = [f"the CPU pool {format_bytes(pool_bytes)}"] if pool_bytes else []
        if device.type == "cpu":
            parts.append(f"the stand-in GPU KV cache {format_bytes(kv_bytes)} ({gpu_pages} pages)")
        raise BenchError(
            f"this run needs {format_bytes(host)} of memory ({' + '.join(parts)}), but only "
            f"{format_bytes(budget)} is available now: lower cpu_bytes_to_use in the config, "
            "or run fewer --sessions-in-flight, shorter prompts or a smaller geometry; "
            "nothing is shrunk to fit"
        )
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if kv_bytes > free * 0.9:
            raise BenchError(
                f"the GPU KV cache needs {format_bytes(kv_bytes)} ({gpu_pages} pages) but the "
                f"GPU has {format_bytes(free)} free: run fewer --sessions-in-flight or shorter "
                "prompts; nothing is shrunk to fit"
            )
    return {"pool_bytes": pool_bytes, "kv_bytes": kv_bytes, "available_bytes": budget}


def build_stack(
    config: KvtiersConfig | None,
    geometry: ModelGeometry,
    gpu_pages: int,
    *,
    device: torch.device,
    kv_layout: str = "layer",
    metrics: MetricsSink | None = None,
) -> Stack:
    """The stack for one run; `config=None`: no offloading (the GPU only).
    `metrics`: the sink the manager's tiers report to (`build_manager`)."""
    check_memory(config, geometry, gpu_pages, device)
    kv = StandInKV(geometry, gpu_pages, device, kv_layout)
    if config is None:
        return Stack(kv)
    cuda = device.type == "cuda"
    # Prefaulted as an engine's pinned pool is: first-touch page faults would
    # otherwise be measured as copy time.
    pool = CpuPool(
        geometry.block_bytes,
        config.cpu_bytes_to_use,
        pin="auto" if cuda else False,
        prefault=True,
    )
    stack = Stack(kv, pool)
    try:
        stack.manager = build_manager(config, pool.view, bench_namespace(geometry),
                                      metrics=metrics)
        stack.tier_names = tuple(tier_names(config))
        stack.swapper = DeviceSwapper(kv.layout, pool)
    except BaseException:
        with contextlib.suppress(Exception):
            stack.close()
        raise
    return stack
