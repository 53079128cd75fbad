"""Per-tier counters. The manager credits each promoted hit to the tier it came from."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvtiers.contract.jobs import FailureReason, JobResult


@dataclass
class TierStats:
    """A snapshot of one tier's counters (plain numbers, JSON-ready via `as_dict`)."""

    hits: int = 0
    misses: int = 0
    blocks_read: int = 0
    blocks_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    evictions: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    usage_bytes: int = 0
    capacity_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class StatsRecorder:
    """Thread-safe accumulation of `TierStats` for tiers whose I/O runs on threads."""

    def __init__(self, capacity_bytes: int | None = None):
        self._lock = threading.Lock()
        self._stats = TierStats(capacity_bytes=capacity_bytes)

    def lookup(self, hit: bool) -> None:
        with self._lock:
            if hit:
                self._stats.hits += 1
            else:
                self._stats.misses += 1

    def job(self, result: JobResult, *, load: bool) -> None:
        """Count a finished job's blocks, bytes, time and failure reasons."""
        with self._lock:
            s = self._stats
            if load:
                s.blocks_read += len(result.ok)
                s.bytes_read += result.bytes_moved
                s.read_seconds += result.seconds
            else:
                s.blocks_written += len(result.ok)
                s.bytes_written += result.bytes_moved
                s.write_seconds += result.seconds
            for reason, n in result.reasons().items():
                s.errors[reason.value] = s.errors.get(reason.value, 0) + n

    def error(self, reason: FailureReason, n: int = 1) -> None:
        with self._lock:
            self._stats.errors[reason.value] = self._stats.errors.get(reason.value, 0) + n

    def evicted(self, n: int = 1) -> None:
        with self._lock:
            self._stats.evictions += n

    def snapshot(self, usage_bytes: int) -> TierStats:
        with self._lock:
            s = self._stats
            # `replace`, not `asdict`: every field but `errors` is immutable, and this
            # runs every scheduler step under vLLM (`get_stats`)
            return replace(s, errors=dict(s.errors), usage_bytes=usage_bytes)
