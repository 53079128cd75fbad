"""s3: the S3 server frozen (SIGSTOP) mid-run, then continued (SIGCONT).

The same run as `s3_kill` (same servers, tier and checks), but the server keeps
its connections open and answers nothing while frozen: requests wait for their
timeout instead of being refused. `longest_wait_s` shows which bound a job really
has (the tier's `timeout_s` is 2 s here; the server is frozen longer than two
requests' timeouts); `recovery_s` runs from SIGCONT to the end of the first job
submitted after it that succeeded whole. A store that passed its deadline may land
on the server once it runs again: the tier deletes such objects once the server
answers (and once more a second later); the usage check waits for the listing to
agree (the tier also lists every `rescan_s`, 2 s here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.chaos.report import Row
from bench.chaos.s3_kill import run_outages

NAME = "s3-server-freeze"
#: per server kind: outages, batches stored before each, seconds the server is frozen
PROFILES: dict[str, dict[str, Any]] = {
    "short": {"servers": ["rclone"], "outages": 1, "warm": 6, "down_s": 6.0},
    "long": {"servers": ["rclone", "seaweedfs"], "outages": 4, "warm": 40, "down_s": 8.0},
}


def run(profile: str, workdir: Path, seed: int) -> list[Row]:
    return run_outages(NAME, PROFILES[profile], workdir, seed, freeze=True)
