"""The worker side's data path: `DeviceSwapper` moves KV blocks between an engine's
GPU KV cache and the CPU pool, converting between the engine's layout (`KVLayout`)
and the canonical slot order of DESIGN.md.

It runs in the GPU worker and needs torch (the extra `kvtiers-core[torch]`), but
importing this package does not import it: building a `DeviceSwapper` or a `KVLayout`
does, and raises `kvtiers.errors.MissingExtraError`, naming the extra, without it.
"""

from kvtiers.swap.layout import KVLayout
from kvtiers.swap.methods import AUTO, CPU, DMA, KERNEL, METHODS, STAGED, MethodPolicy
from kvtiers.swap.swap_job import SwapResult, SwapStats
from kvtiers.swap.swapper import DeviceSwapper

__all__ = [
    "AUTO",
    "CPU",
    "DMA",
    "KERNEL",
    "METHODS",
    "STAGED",
    "DeviceSwapper",
    "KVLayout",
    "MethodPolicy",
    "SwapResult",
    "SwapStats",
]
