"""What this machine can honour: everything a config puts in RAM - the CPU pool
plus every tier that holds its blocks in memory (`"x-kvtiers": "ram_bytes"`) - must
fit in physical memory (or the container's limit). The allocator
(`kvtiers.pool.memory`) checks the pool again, against what is available at that
moment, before it allocates anything.

More than memory is an error, never clamped: a silently smaller pool would change
hit rates without anyone deciding it. Less than memory but more than is available
now, or leaving under a tenth of it to the engine and the OS, is a warning: the
machine may be busy with what will be gone at start-up, but usually it is not.
/dev/shm is only a warning too: the pool lives there only when several processes
share it (an engine with worker processes); the pool allocator refuses it then.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtiers.errors import ConfigProblem
from kvtiers.humanize import format_bytes
from kvtiers.pool.memory import memory_limits, shm_space

SHM_DIR = "/dev/shm"
# Below this share of memory left free, the engine, the model's host copy and the
# OS are likely to run short.
HEADROOM = 0.10


def physical_memory_bytes() -> int | None:
    """The most memory a pool may ever take here: physical RAM, or the cgroup
    (container) limit when lower; None where the OS does not say."""
    try:
        limits = memory_limits()
    except (OSError, ValueError):
        return None
    if limits.cgroup is not None:
        return min(limits.physical, limits.cgroup)
    return limits.physical


def available_memory_bytes() -> int | None:
    """What can be allocated now without swapping (MemAvailable), or None."""
    try:
        return memory_limits().available
    except (OSError, ValueError):
        return None


def shm_bytes(directory: str = SHM_DIR) -> int | None:
    """Total size of the shared-memory filesystem, or None if there is none."""
    try:
        return shm_space(directory)[1]
    except (AttributeError, OSError):
        return None


def _both(n: int) -> str:
    return f"{format_bytes(n)} ({n} bytes)"


def check_pool(
    nbytes: int,
    path: str,
    memory: int | None = None,
    shm: int | None = None,
) -> tuple[list[ConfigProblem], list[str]]:
    """Problems and warnings for a pool of `nbytes` alone on this machine (`memory`
    and `shm` override what the machine reports, for tests)."""
    return check_ram(nbytes, path, [], memory=memory, shm=shm)


def check_ram(
    pool: int,
    path: str,
    tiers: Sequence[tuple[str, int]],
    *,
    memory: int | None = None,
    available: int | None = None,
    shm: int | None = None,
) -> tuple[list[ConfigProblem], list[str]]:
    """Problems and warnings for a pool of `pool` bytes (at JSON path `path`) plus
    tiers holding `(path, bytes)` of RAM each. `memory`, `available` and `shm`
    override what the machine reports (for tests; a given `memory` without
    `available` means all of it is available)."""
    if memory is None:
        memory = physical_memory_bytes()
        available = available_memory_bytes() if available is None else available
    elif available is None:
        available = memory
    shm = shm_bytes() if shm is None else shm
    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    total = pool + sum(n for _, n in tiers)
    parts = ", ".join(f"{where} {format_bytes(n)}" for where, n in tiers)
    together = (
        f"the CPU pool ({format_bytes(pool)}) plus the tiers that keep blocks in RAM "
        f"({parts}), {_both(total)} in all,"
    )
    if memory is not None and pool > memory:
        problems.append(
            ConfigProblem(
                path,
                f"{_both(pool)} is more than this machine's physical memory, "
                f"{_both(memory)}; lower cpu_bytes_to_use well below that, leaving room "
                "for the engine and the OS (or validate on the machine that will run it, "
                "or pass --skip-machine-checks)",
            )
        )
        return problems, warnings
    if memory is not None and total > memory:
        problems.append(
            ConfigProblem(
                path,
                f"{together} is more than this machine's physical memory, {_both(memory)}; "
                "lower them well below that (or validate on the machine that will run "
                "it, or pass --skip-machine-checks)",
            )
        )
        return problems, warnings
    what = together if tiers else f"{format_bytes(pool)}"
    if available is not None and memory is not None and total > available:
        warnings.append(
            f"{path}: {what} is more than is available now ({format_bytes(available)} of "
            f"{format_bytes(memory)}, MemAvailable): the pool allocator refuses a pool "
            "larger than what is available at start-up, and memory tiers would push the "
            "machine into swap or the OOM killer; free memory first or lower "
            "cpu_bytes_to_use"
        )
    elif memory is not None and total > memory * (1 - HEADROOM):
        warnings.append(
            f"{path}: {what} leaves {format_bytes(memory - total)} of this machine's "
            f"{format_bytes(memory)} (less than {HEADROOM:.0%}) for the engine, the model "
            "and the OS; lower cpu_bytes_to_use unless this machine does nothing else"
        )
    if shm is not None and pool > shm:
        warnings.append(
            f"{path}: {format_bytes(pool)} is more than {SHM_DIR} "
            f"({format_bytes(shm)}); an engine with worker processes keeps the pool "
            f"there and will refuse to start: enlarge {SHM_DIR} or lower cpu_bytes_to_use"
        )
    return problems, warnings
