"""What every chaos scenario reports (`Row`), the table `run.py` prints and the JSON
it writes. A row's `problems` are the scenario's broken promises (wrong bytes, lost
blocks, usage that does not match the store, a fault that did not have its
effect); the runner exits 1 when any row has one."""

from __future__ import annotations

import json
import platform
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Row", "machine", "table", "write_json"]


@dataclass
class Row:
    """One scenario's outcome. Times are real seconds; `usage_bytes` is what the
    tier counts against its capacity, `store_bytes` what its store really holds,
    measured from outside the tier (files on disk, objects listed)."""

    scenario: str
    skipped: str = ""  # why the scenario did not run (empty: it ran)
    rounds: int = 0
    blocks_stored: int = 0  # reported stored by the tier
    blocks_checked: int = 0  # loaded back and compared byte for byte
    wrong_bytes: int = 0  # bytes of loaded blocks that differ from what was stored
    lost_blocks: int = 0  # reported stored, never reported removed, then not served
    longest_wait_s: float = 0.0  # the longest single job, submit to result
    #: the longest single scheduler-side call (lookup, submit, collecting results):
    #: a tier that blocks the scheduler thread shows here
    scheduler_stall_s: float = 0.0
    scheduler_stall_call: str = ""  # which call that was
    errors: Counter[str] = field(default_factory=Counter)  # "op:reason" -> keys
    recovery_s: float | None = None  # fault gone -> first job that succeeded again
    usage_bytes: int | None = None
    store_bytes: int | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def usage_matches(self) -> bool | None:
        if self.usage_bytes is None or self.store_bytes is None:
            return None
        return self.usage_bytes == self.store_bytes

    def check(self) -> None:
        """Turn the figures every scenario must hold into problems."""
        if self.skipped:
            return
        if self.wrong_bytes:
            self.problems.append(f"{self.wrong_bytes} wrong bytes served")
        if self.lost_blocks:
            self.problems.append(f"{self.lost_blocks} blocks reported stored were lost")
        if self.usage_matches is False:
            self.problems.append(f"usage {self.usage_bytes} B but the store holds "
                                 f"{self.store_bytes} B")
        if not self.blocks_checked:
            self.problems.append("no block was loaded back and checked")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["errors"] = dict(sorted(self.errors.items()))
        out["usage_matches"] = self.usage_matches
        return out


def machine() -> str:
    import os

    return (f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}")


def _errors(errors: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "-"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: list[Row]) -> str:
    head = (f"{'scenario':<28} {'rounds':>6} {'stored':>7} {'checked':>7} {'wrong B':>7} "
            f"{'lost':>5} {'wait s':>7} {'stall s':>7} {'recov s':>7} {'usage / store':>21}  "
            "errors by reason")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.skipped:
            lines.append(f"{r.scenario:<28} skipped: {r.skipped}")
            continue
        usage = "-" if r.usage_matches is None else \
            f"{r.usage_bytes}/{r.store_bytes} {'ok' if r.usage_matches else 'NO'}"
        lines.append(f"{r.scenario:<28} {r.rounds:>6} {r.blocks_stored:>7} "
                     f"{r.blocks_checked:>7} {r.wrong_bytes:>7} {r.lost_blocks:>5} "
                     f"{r.longest_wait_s:>7.2f} {r.scheduler_stall_s:>7.3f} "
                     f"{_secs(r.recovery_s):>7} {usage:>21}  "
                     f"{_errors(r.errors)}")
        lines += [f"{'':<28}   note: {n}" for n in r.notes]
        lines += [f"{'':<28}   PROBLEM: {p}" for p in r.problems]
    return "\n".join(lines)


def write_json(path: Path, profile: str, rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": " ".join(sys.argv), "machine": machine(), "profile": profile,
           "scenarios": [r.as_dict() for r in rows]}
    path.write_text(json.dumps(doc, indent=1) + "\n")
