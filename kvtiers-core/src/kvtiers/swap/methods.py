"""Which copy method a job uses.

Methods: `dma` (copy engines, one batched call), `kernel` (small-grid copy kernel
over mapped pinned memory), `staged` (GPU gather/scatter kernel through a staging ring
+ one DMA run per block), and `cpu` (the CPU stand-in). The kernel is compiled with
NVRTC, or is Triton's where NVRTC is missing. `auto` picks per job from the shape of its
coalesced runs:

- few runs (`<= dma_max_runs`) or long runs (mean `>= dma_min_run_bytes`): `dma` —
  the copy engines reach the link's speed on long runs and cost no SM time, and a
  kernel launch is not worth it for a handful of copies;
- otherwise (many small fragments): `small_method` (`staged` by default, see
  docs/benchmarks.md for the measurements behind the defaults).

A method the machine cannot run (no cuMemcpyBatchAsync, neither NVRTC nor Triton, a
pool that is not mapped) is replaced by the next usable one, in the order of `FALLBACK`.
"""

from __future__ import annotations

__all__ = ["AUTO", "CPU", "DMA", "KERNEL", "METHODS", "STAGED", "MethodPolicy"]

AUTO = "auto"
DMA = "dma"
KERNEL = "kernel"
STAGED = "staged"
CPU = "cpu"
METHODS = (DMA, KERNEL, STAGED)
FALLBACK = {DMA: (KERNEL, STAGED), KERNEL: (STAGED, DMA), STAGED: (KERNEL, DMA)}

DEFAULT_DMA_MIN_RUN_BYTES = 256 * 1024
DEFAULT_DMA_MAX_RUNS = 8


class MethodPolicy:
    """The swapper's method choice. `method`: `auto` or one of `METHODS` for every
    job (a job may still ask for its own at submit)."""

    def __init__(
        self,
        method: str = AUTO,
        *,
        small_method: str = STAGED,
        dma_min_run_bytes: int = DEFAULT_DMA_MIN_RUN_BYTES,
        dma_max_runs: int = DEFAULT_DMA_MAX_RUNS,
    ):
        if method != AUTO and method not in METHODS:
            raise ValueError(f"method must be {AUTO!r} or one of {METHODS}, got {method!r}")
        if small_method not in METHODS:
            raise ValueError(f"small_method must be one of {METHODS}, got {small_method!r}")
        self.method = method
        self.small_method = small_method
        self.dma_min_run_bytes = dma_min_run_bytes
        self.dma_max_runs = dma_max_runs
        self.available: tuple[str, ...] = METHODS

    def restrict(self, available: tuple[str, ...]) -> None:
        """Keep to the methods this machine can run."""
        self.available = available
        if self.method != AUTO:
            self.method = self.usable(self.method)
        self.small_method = self.usable(self.small_method)

    def usable(self, method: str) -> str:
        if method in self.available:
            return method
        for other in FALLBACK[method]:
            if other in self.available:
                return other
        raise ValueError(f"no usable copy method (wanted {method!r}, have {self.available})")

    def choose(self, requested: str | None, runs: int, nbytes: int) -> str:
        """The method for one job of `runs` copy runs (before coalescing across
        blocks) and `nbytes` bytes; `requested` (a job's own choice) wins if usable."""
        if requested is not None and requested != AUTO:
            return self.usable(requested)
        if self.method != AUTO:
            return self.method
        if runs <= self.dma_max_runs or nbytes >= self.dma_min_run_bytes * runs:
            return self.usable(DMA)
        return self.small_method
