"""What this machine can honour: a CPU pool must fit in physical memory (or the
container's limit). The allocator (`kvtiers.pool_memory`) checks again, against
what is available at that moment, before it allocates anything.

A pool larger than memory is an error, never clamped: a silently smaller pool
would change hit rates without anyone deciding it. /dev/shm is only a warning: the
pool lives there only when several processes share it (an engine with worker
processes); the pool allocator refuses it then.
"""

from __future__ import annotations

from kvtiers.humanize import format_bytes
from kvtiers.errors import ConfigProblem
from kvtiers.pool_memory import memory_limits, shm_space

SHM_DIR = "/dev/shm"


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


def shm_bytes(directory: str = SHM_DIR) -> int | None:
    """Total size of the shared-memory filesystem, or None if there is none."""
    try:
        return shm_space(directory)[1]
    except (AttributeError, OSError):
        return None


def check_pool(
    nbytes: int,
    path: str,
    memory: int | None = None,
    shm: int | None = None,
) -> tuple[list[ConfigProblem], list[str]]:
    """Problems and warnings for a pool of `nbytes` on this machine (`memory` and
    `shm` override what the machine reports, for tests)."""
    memory = physical_memory_bytes() if memory is None else memory
    shm = shm_bytes() if shm is None else shm
    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    if memory is not None and nbytes > memory:
        problems.append(
            ConfigProblem(
                path,
                f"{format_bytes(nbytes)} ({nbytes} bytes) is more than this machine's "
                f"physical memory, {format_bytes(memory)} ({memory} bytes); lower "
                "cpu_bytes_to_use well below that, leaving room for the engine and the "
                "OS (or validate on the machine that will run it, or pass "
                "--skip-machine-checks)",
            )
        )
    elif shm is not None and nbytes > shm:
        warnings.append(
            f"{path}: {format_bytes(nbytes)} is more than {SHM_DIR} "
            f"({format_bytes(shm)}); an engine with worker processes keeps the pool "
            f"there and will refuse to start: enlarge {SHM_DIR} or lower cpu_bytes_to_use"
        )
    return problems, warnings
