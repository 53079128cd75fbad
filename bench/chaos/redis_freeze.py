"""redis: the Redis server frozen (SIGSTOP) mid-run, then continued (SIGCONT).

The same run as `redis_kill` (same server, tier and checks), but the server keeps
its connections open and answers nothing while frozen: requests wait for the
tier's `timeout_s` (2 s here; the server is frozen longer than two of them)
instead of being refused. `longest_wait_s` shows the bound a job really has,
`scheduler_stall_s` that the scheduler's calls did not wait for the server, and
`recovery_s` runs from SIGCONT to the end of the first job submitted after it
that succeeded whole. A SET sent before the freeze and past its deadline may
still be applied once the server runs again: the usage check then shows whether
the tier accounts for such a value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.chaos.redis_kill import run_outages
from bench.chaos.report import Row

NAME = "redis-server-freeze"
#: outages, batches stored before each, seconds the server is frozen
PROFILES: dict[str, dict[str, Any]] = {
    "short": {"outages": 1, "warm": 6, "down_s": 5.0},
    "long": {"outages": 4, "warm": 40, "down_s": 8.0},
}


def run(profile: str, workdir: Path, seed: int) -> list[Row]:
    return run_outages(NAME, PROFILES[profile], workdir, seed, freeze=True)
