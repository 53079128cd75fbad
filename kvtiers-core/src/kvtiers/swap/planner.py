"""Per-group copy templates, so that planning a job is a handful of numpy operations.

`plan.make_runs` derives a job's runs from the layout's templates on every call
(about 15 array operations, then coalescing: ~85 µs of host time per 16-block job on
the H200 host, as much as the copy of a small job is worth). A `GroupPlanner` does
that derivation once per KV group: each block of a job becomes the same `E`
*entries* (a run of one page of one template run, in canonical order), and entry
`e` of block `b` copies `length[e]` bytes between

    engine address  eng_base[e] + pages[b, col[e]] * stride[e]
    buffer offset   block_offsets[b] + rel[e]

(`eng_base` already holds the region's device address). A job is then two
broadcasts and a prefix of a cached tiled array; `runs` coalesces them as
`make_runs` does (same runs, checked against it in tests/swap/test_planner.py),
`pieces` gives the entries cut into kernel pieces of at most `piece_bytes`.

Pure numpy: the CPU and CUDA backends plan through the same code. Called from the
swapper's submitting thread only (the tiled caches grow on first use).
"""

from __future__ import annotations

import numpy as np

from kvtiers.swap.layout import KVLayout
from kvtiers.swap.plan import PIECE_BYTES

__all__ = ["Entries", "GroupPlanner", "coalesce_arrays"]


class Entries:
    """One block's copies as templates (arrays of length `E`, canonical order)."""

    def __init__(
        self,
        eng_base: np.ndarray,
        stride: np.ndarray,
        col: np.ndarray,
        rel: np.ndarray,
        length: np.ndarray,
        region: np.ndarray,
        pages_per_block: int,
    ):
        self.eng_base = eng_base
        self.stride = stride
        self.col = col
        self.rel = rel
        self.length = length
        self.region = region
        self.per_block = len(length)
        self.pages_per_block = pages_per_block
        self._tiles: dict[str, np.ndarray] = {}

    def engine(self, pages: np.ndarray) -> np.ndarray:
        """Engine addresses, `[B * E]`, for `pages` of shape `[B, pages_per_block]`."""
        picked = pages.reshape(-1, 1) if self.pages_per_block == 1 else pages[:, self.col]
        out: np.ndarray = (picked * self.stride + self.eng_base).reshape(-1)
        return out

    def buffer(self, block_offsets: np.ndarray) -> np.ndarray:
        """Buffer offsets, `[B * E]`, for blocks whose part starts at `block_offsets`."""
        out: np.ndarray = (block_offsets.reshape(-1, 1) + self.rel).reshape(-1)
        return out

    def tiled(self, name: str, blocks: int) -> np.ndarray:
        """`length`, `region` or `words` (length / 8) repeated for `blocks` blocks
        (a prefix of a cached array: read-only by convention)."""
        want = blocks * self.per_block
        t = self._tiles.get(name)
        if t is None or len(t) < want:
            base = {"length": self.length, "region": self.region, "words": self.length // 8}
            reps = max(blocks, 2 * (len(t) // self.per_block) if t is not None else 64)
            t = np.tile(base[name], reps)
            self._tiles[name] = t
        return t[:want]

    def split(self, piece: int) -> Entries:
        """The same copies cut into pieces of at most `piece` bytes."""
        if len(self.length) == 0 or int(self.length.max()) <= piece:
            return self
        counts = -(-self.length // piece)
        owner = np.repeat(np.arange(len(self.length)), counts)
        first = np.cumsum(counts) - counts
        step = (np.arange(int(counts.sum()), dtype=np.int64) - first[owner]) * piece
        length = np.minimum(self.length[owner] - step, piece)
        return Entries(
            self.eng_base[owner] + step, self.stride[owner], self.col[owner],
            self.rel[owner] + step, length, self.region[owner], self.pages_per_block,
        )  # fmt: skip


class GroupPlanner:
    """The templates of one KV group (`layout`), its regions at `region_addresses`
    (their device or host addresses: the CPU backend passes its own)."""

    def __init__(
        self, layout: KVLayout, region_addresses: np.ndarray, piece_bytes: int = PIECE_BYTES
    ):
        t = layout.templates
        n = layout.pages_per_block
        r = len(t.length)
        owner = np.repeat(np.arange(r), n)  # entry (r, j) in canonical order
        col = np.tile(np.arange(n, dtype=np.int64), r)
        self.layout = layout
        self.entries = Entries(
            region_addresses.astype(np.int64)[t.region[owner]] + t.offset[owner],
            t.stride[owner],
            col,
            t.canon[owner] + col * t.length[owner],
            t.length[owner].copy(),
            t.region[owner].copy(),
            n,
        )
        self.pieces = self.entries.split(piece_bytes)
        self.multi_region = len(np.unique(t.region)) > 1

    def runs(
        self, pages: np.ndarray, block_offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(engine addresses, buffer offsets, lengths) of the job's runs, coalesced
        where both sides continue each other (as `plan.make_runs`)."""
        e = self.entries
        b = len(block_offsets)
        region = e.tiled("region", b) if self.multi_region else None
        return coalesce_arrays(
            e.engine(pages), e.buffer(block_offsets), e.tiled("length", b), region
        )

    def piece_runs(
        self, pages: np.ndarray, block_offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(engine addresses, buffer offsets, words) of the job's kernel pieces, not
        coalesced (a kernel copies them at the same speed either way)."""
        p = self.pieces
        return p.engine(pages), p.buffer(block_offsets), p.tiled("words", len(block_offsets))


def coalesce_arrays(
    engine: np.ndarray, buffer: np.ndarray, length: np.ndarray, region: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge each run into the previous one where both sides continue it (and, with
    `region`, both lie in the same region)."""
    if len(length) < 2:
        return engine, buffer, length
    head = length[:-1]
    joins = (engine[1:] == engine[:-1] + head) & (buffer[1:] == buffer[:-1] + head)
    if region is not None:
        joins &= region[1:] == region[:-1]
    if not joins.any():
        return engine, buffer, length
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    return engine[starts], buffer[starts], np.add.reduceat(length, starts)
