"""p2p: a `kvtiers serve` cache node frozen (SIGSTOP) while an engine's p2p tier
pushes into it and pulls from it, then continued (SIGCONT).

The same node, puller and checks as `p2p_node` (which see), without the restart:
the node keeps its connections and its pool but answers nothing, so the puller's
keep-alives (1.5 s here) mark it away and its jobs fail until it runs again.
`longest_wait_s` shows the bound a job really has, `scheduler_stall_s` that the
scheduler's calls never waited for the node; every block stored must load after
SIGCONT (the pool kept it)."""

from __future__ import annotations

from pathlib import Path

from bench.chaos.p2p_node import FREEZE_NAME, PROFILES, run_node
from bench.chaos.report import Row

NAME = FREEZE_NAME


def run(profile: str, workdir: Path, seed: int) -> list[Row]:
    return run_node(NAME, PROFILES[profile], workdir, seed, freeze=True)
