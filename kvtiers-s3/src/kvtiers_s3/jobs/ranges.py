"""Coalescing ranged reads: the records a load job needs from one packed segment,
fetched with as few GETs as make sense.

A job promotes a prefix of a request, and a segment holds consecutive blocks of
the job that stored them, so the records a load wants usually sit side by side in
a segment. One GET of the span that covers them costs one request instead of one
per block - for 64 KiB blocks that is the difference between request-bound and
bandwidth-bound (docs/tiers/s3.md has the figures). Records further apart than
`max_gap` bytes, or a span that would exceed `max_read`, start a new read.

Pure functions, any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Read", "coalesce"]


@dataclass(frozen=True, slots=True)
class Read:
    """One ranged GET of `[start, end)`; `members[i] = (item, offset, length)`: the
    caller's item `item` is at `offset` (relative to `start`) for `length` bytes."""

    start: int
    end: int
    members: tuple[tuple[int, int, int], ...]


def coalesce(wanted: Sequence[tuple[int, int, int]], *, max_gap: int,
             max_read: int) -> list[Read]:
    """Reads covering every `(item, offset, length)` of `wanted` (ranges in one
    object, not overlapping), in offset order. Two ranges share a read when the
    bytes between them are at most `max_gap` and the read stays within `max_read`
    bytes (a single range longer than `max_read` is read alone)."""
    out: list[Read] = []
    run: list[tuple[int, int, int]] = []
    start = end = 0
    for item, offset, length in sorted(wanted, key=lambda w: w[1]):
        if run and (offset - end > max_gap or offset + length - start > max_read):
            out.append(_read(start, end, run))
            run = []
        if not run:
            start = offset
        run.append((item, offset, length))
        end = max(end, offset + length) if len(run) > 1 else offset + length
    if run:
        out.append(_read(start, end, run))
    return out


def _read(start: int, end: int, run: list[tuple[int, int, int]]) -> Read:
    return Read(start, end, tuple((item, offset - start, length) for item, offset, length in run))
