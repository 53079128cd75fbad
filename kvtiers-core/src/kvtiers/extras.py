"""Optional dependencies: which features need torch, and the error that says so.

The scheduler side (manager, pool, tiers, config, plugins, CLI) runs without torch, so
that a storage node or a tier plugin's CI never installs it. torch is needed only by
the worker side — `DeviceSwapper` and `KVLayout` (`kvtiers.swap`), a pool's CUDA
registration and `CpuPool.tensor()` — and by `kvtiers bench`; each of them imports it
where it is used and turns a failed import into `MissingExtraError`, which names the
extra to install.
"""

from __future__ import annotations

from kvtiers.errors import MissingExtraError

__all__ = ["BENCH_EXTRA", "TORCH_EXTRA", "missing_torch"]

TORCH_EXTRA = "torch"
"""`kvtiers-core[torch]`: the worker side (DeviceSwapper, CUDA registration of the pool)."""

BENCH_EXTRA = "bench"
"""`kvtiers-core[bench]`: `kvtiers bench` (torch, and matplotlib for --plot)."""


def missing_torch(
    feature: str, cause: ImportError, *, extra: str = TORCH_EXTRA
) -> MissingExtraError:
    """The error for `feature` when `import torch` failed with `cause`: raise it
    `from cause`. The message names the extra and the install order: torch first,
    pinned, since an unpinned resolve pulls a CUDA build of several GB."""
    return MissingExtraError(
        f"{feature} needs torch, which cannot be imported here ({cause}). It comes with "
        f"the extra kvtiers-core[{extra}]: install torch first, pinned to the build you "
        f"want (pip install torch==<version>, e.g. from the CPU or your CUDA index; an "
        f"unpinned install resolves to a CUDA build of several GB), then "
        f"pip install 'kvtiers-core[{extra}]'",
        extra=extra,
        package="torch",
    )
