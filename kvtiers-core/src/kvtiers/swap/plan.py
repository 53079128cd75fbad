"""Turning one job (engine pages, slots) into copy runs, vectorised.

A run is `(region, engine offset, buffer offset, length)`: `length` bytes at
`offset` within one of the layout's regions, and at `buffer offset` within the
target buffer (the pool's memory, or a staging buffer). Runs are produced in
canonical order per block and then merged where both sides continue each other
(coalescing), so a job of cross-layer pages in consecutive slots may become a single
run. Nothing here loops over blocks in Python: every step is a numpy operation over
the whole job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtiers.swap.layout import KVLayout

__all__ = [
    "BlockCheck",
    "Runs",
    "check_blocks",
    "coalesce",
    "make_runs",
    "make_table",
    "split_runs",
]

STORE = "store"
LOAD = "load"
# Pieces for the copy kernel: equal work per piece, and small enough that a 2 MiB
# run is shared by several programs.
PIECE_BYTES = 64 * 1024


@dataclass
class Runs:
    region: np.ndarray  # int64 [n]
    engine: np.ndarray  # int64 [n] byte offset within the region
    buffer: np.ndarray  # int64 [n] byte offset within the buffer
    length: np.ndarray  # int64 [n]

    def __len__(self) -> int:
        return len(self.length)

    @property
    def nbytes(self) -> int:
        return int(self.length.sum())

    def take(self, index: np.ndarray) -> Runs:
        return Runs(self.region[index], self.engine[index], self.buffer[index], self.length[index])


@dataclass
class BlockCheck:
    """The blocks of a job that can run (`valid`), with their pages and slots, and a
    reason in words for those that cannot."""

    n_blocks: int
    valid: np.ndarray  # bool [n_blocks]
    pages: np.ndarray  # int64 [n_valid, pages_per_block]
    slots: np.ndarray  # int64 [n_valid]
    problem: str = ""


def _as_index_array(values: object, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == object or arr.dtype.kind not in "iu":
        if arr.size == 0:
            return arr.astype(np.int64).reshape(arr.shape)
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def check_blocks(
    layout: KVLayout, num_slots: int, pages: object, slots: object, direction: str
) -> BlockCheck:
    """Validate a job's indices. A block whose page or slot is out of range, or whose
    destination appears twice in the job (two blocks into one slot on a store, into
    one page on a load), is invalid; the others run. A job whose arrays do not match
    in shape is invalid as a whole (`TypeError`/`ValueError` with the reason)."""
    n = layout.pages_per_block
    slots_arr = _as_index_array(slots, "slots").reshape(-1)
    pages_arr = _as_index_array(pages, "gpu_pages")
    b = len(slots_arr)
    if pages_arr.ndim == 2 and pages_arr.shape[1] != n:
        raise ValueError(
            f"gpu_pages has {pages_arr.shape[1]} columns, the layout {n} pages per block"
        )
    if pages_arr.size != b * n:
        raise ValueError(f"{b} slots need {b * n} gpu pages ({n} per block), got {pages_arr.size}")
    pages_arr = pages_arr.reshape(b, n)
    bad_page = ((pages_arr < 0) | (pages_arr >= layout.num_pages)).any(axis=1)
    bad_slot = (slots_arr < 0) | (slots_arr >= num_slots)
    if direction == STORE:
        dup = _duplicated(slots_arr)
    else:
        flat_dup = _duplicated(pages_arr.reshape(-1)).reshape(b, n)
        dup = np.asarray(flat_dup.any(axis=1))  # an array (numpy's stubs say maybe a bool)
    valid = ~(bad_page | bad_slot | dup)
    problem = ""
    if not valid.all():
        parts = []
        if bad_page.any():
            parts.append(f"{int(bad_page.sum())} with a page outside 0..{layout.num_pages - 1}")
        if bad_slot.any():
            parts.append(f"{int(bad_slot.sum())} with a slot outside 0..{num_slots - 1}")
        if dup.any():
            what = "slot" if direction == STORE else "page"
            parts.append(f"{int(dup.sum())} writing a {what} another block of the job writes")
        problem = "; ".join(parts)
    return BlockCheck(b, valid, pages_arr[valid], slots_arr[valid], problem)


def _duplicated(values: np.ndarray) -> np.ndarray:
    """True for every element whose value appears more than once."""
    if len(values) < 2:
        return np.zeros(len(values), bool)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return counts[inverse] > 1


def make_runs(
    layout: KVLayout, pages: np.ndarray, block_offsets: np.ndarray, *, coalesce_runs: bool = True
) -> Runs:
    """The runs that copy blocks `pages[b]` (shape [B, pages_per_block]) to or from
    the buffer at `block_offsets[b]` (the byte offset of the block's rank part)."""
    t = layout.templates
    n = layout.pages_per_block
    b = len(block_offsets)
    r = len(t.length)
    # Shape [B, R, N]: for each block, each template run, each page of the block; in
    # canonical order, since canon(r, j) = canon[r] + j * length[r] grows with (r, j).
    pg = pages.reshape(b, 1, n)
    engine = t.offset[None, :, None] + pg * t.stride[None, :, None]
    j = np.arange(n, dtype=np.int64)[None, None, :]
    buffer = block_offsets.reshape(b, 1, 1) + t.canon[None, :, None] + j * t.length[None, :, None]
    shape = (b, r, n)
    runs = Runs(
        np.broadcast_to(t.region[None, :, None], shape).reshape(-1),
        engine.reshape(-1),
        buffer.reshape(-1),
        np.broadcast_to(t.length[None, :, None], shape).reshape(-1),
    )
    return coalesce(runs) if coalesce_runs else runs


def coalesce(runs: Runs) -> Runs:
    """Merge each run into the previous one where both sides continue it."""
    if len(runs) < 2:
        return runs
    end_e = runs.engine[:-1] + runs.length[:-1]
    end_b = runs.buffer[:-1] + runs.length[:-1]
    joins = (
        (runs.region[1:] == runs.region[:-1])
        & (runs.engine[1:] == end_e)
        & (runs.buffer[1:] == end_b)
    )
    if not joins.any():
        return runs
    starts = np.flatnonzero(np.r_[True, ~joins])
    return Runs(
        runs.region[starts],
        runs.engine[starts],
        runs.buffer[starts],
        np.add.reduceat(runs.length, starts),
    )


def split_runs(runs: Runs, piece: int) -> Runs:
    """Cut runs into pieces of at most `piece` bytes (the last piece of a run may be
    shorter), so that copy kernels can share the work evenly."""
    if len(runs) == 0 or int(runs.length.max()) <= piece:
        return runs
    counts = -(-runs.length // piece)
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(runs)), counts)
    first = np.cumsum(counts) - counts
    k = np.arange(total, dtype=np.int64) - first[owner]
    step = k * piece
    length = np.minimum(runs.length[owner] - step, piece)
    return Runs(runs.region[owner], runs.engine[owner] + step, runs.buffer[owner] + step, length)


def make_table(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """The copy kernel's int64 `[3, n]` table: source and destination addresses and
    lengths in 8-byte words (every address and length a multiple of 8)."""
    table = np.empty((3, len(nbytes)), dtype=np.int64)
    table[0] = src
    table[1] = dst
    table[2] = nbytes // 8
    return table


def split_at_boundaries(runs: Runs, base: int, step: int) -> Runs:
    """Cut runs where their buffer side crosses `base + k * step`: the edges of the
    pool's separate CUDA registrations, which one DMA may not span."""
    if len(runs) == 0:
        return runs
    first = (runs.buffer - base) // step
    last = (runs.buffer + runs.length - 1 - base) // step
    counts = last - first + 1
    if int(counts.max()) == 1:
        return runs
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(runs)), counts)
    k = np.arange(total, dtype=np.int64) - (np.cumsum(counts) - counts)[owner]
    run_start = runs.buffer[owner]
    run_end = run_start + runs.length[owner]
    edge = base + (first[owner] + k) * step  # start of the registration the piece lies in
    start = np.maximum(run_start, edge)
    end = np.minimum(run_end, edge + step)
    return Runs(runs.region[owner], runs.engine[owner] + (start - run_start), start, end - start)
