"""The worker side's data path: `DeviceSwapper` moves KV blocks between an engine's
GPU KV cache and the CPU pool, converting between the engine's layout (`KVLayout`)
and the canonical slot order of DESIGN.md.

Importing this package imports torch (it runs in the GPU worker); `import kvtiers`
does not import it.
"""

from kvtiers.swap.job import SwapResult, SwapStats
from kvtiers.swap.layout import KVLayout
from kvtiers.swap.methods import AUTO, CPU, DMA, KERNEL, METHODS, STAGED, MethodPolicy
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
