"""`RequestLatency`: how long each request of the tier's jobs took - one GET of a
load (issued to its blocks verified in their slots) or one PUT of a store (the
object made to its answer) - per request, not per job, in fixed memory.

Each kind keeps a histogram of logarithmic buckets, 8 per octave (a bucket is 9%
wide) from 1 µs to 2^27 µs (134 s; longer goes in the last): percentiles are exact
to the bucket, whatever the number of requests. Only requests that succeeded are
timed; failures are counted in the tier's errors.

Threads: `record` runs on the tier's event loop only; `summary` and `values` may
run on any thread: they copy each bucket list (one C call) and may miss a request
recorded meanwhile, never see a torn count.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["LOAD", "STORE", "RequestLatency"]

LOAD, STORE = "load", "store"
PER_OCTAVE = 8
OCTAVES = 27
BUCKETS = PER_OCTAVE * OCTAVES + 1  # the last holds everything longer


class RequestLatency:
    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {LOAD: [0] * BUCKETS, STORE: [0] * BUCKETS}

    def record(self, kind: str, seconds: float) -> None:
        """One request of `kind` (LOAD or STORE) took `seconds` (the loop thread)."""
        us = seconds * 1e6
        b = 0 if us <= 1.0 else min(BUCKETS - 1, int(math.log2(us) * PER_OCTAVE) + 1)
        self._counts[kind][b] += 1

    @staticmethod
    def _seconds(bucket: int) -> float:
        """A bucket's value: the geometric middle of its bounds (bucket 0: 1 µs)."""
        if bucket == 0:
            return 1e-6
        return 2 ** ((bucket - 0.5) / PER_OCTAVE) * 1e-6

    def values(self, kind: str) -> list[float]:
        """Every request's seconds, as bucket values, smallest first (for pooling
        several tiers' or runs' requests before taking percentiles)."""
        counts = list(self._counts[kind])
        return [self._seconds(b) for b, n in enumerate(counts) for _ in range(n)]

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per kind: `requests`, and `p50_ms`, `p99_ms`, `max_ms` (None without
        requests)."""
        out: dict[str, dict[str, Any]] = {}
        for kind, live in self._counts.items():
            counts = list(live)
            total = sum(counts)
            row: dict[str, Any] = {"requests": total}
            for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("max_ms", 1.0)):
                row[name] = None if not total else self._quantile(counts, total, q) * 1e3
            out[kind] = row
        return out

    def _quantile(self, counts: list[int], total: int, q: float) -> float:
        rank = min(total, max(1, math.ceil(q * total)))  # the rank-th smallest
        seen = 0
        for b, n in enumerate(counts):
            seen += n
            if seen >= rank:
                return self._seconds(b)
        return self._seconds(BUCKETS - 1)
