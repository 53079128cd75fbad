"""The swapper without CUDA: CPU tensors stand in for GPU memory, so CI runs every
layout and job shape through the same planning code as the GPU path.

Each direction has one worker thread (stores and loads overlap, as the CUDA
streams do); a job is one vectorised copy per engine region: the runs are cut into
equal rows, viewed through `as_strided` windows over the region and the pool, and
gathered into a reusable buffer (`numpy.take`) and scattered out of it (fancy
assignment), chunk by chunk so that the buffer stays in cache. Measured on the
2-core machine: numpy's row copies run at memcpy speed (15-23 GB/s), torch's
`index_select`/`index_copy_` at 6-11 GB/s, and a whole-job temporary (no chunks)
at half the speed. Words are int64 where the offsets allow. Where one side's rows
are consecutive, the copy is a single pass straight from (or into) that side. Jobs of
large rows are split between the job's thread and a helper (each with 1 MiB of the
buffer, one core's L2); jobs of small fragments measured faster on one thread.

When the optional native helper `kvtiers.swap._memcpy` was built (a C compiler at
install time), a job is instead one `copy_batch` call: one `memcpy` per run, in one
pass, without the GIL, its bytes split over two threads for jobs of at least 1 MiB;
the numpy path above is the fallback where the helper is missing.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
import torch

from kvtiers.swap.layout import KVLayout
from kvtiers.swap.plan import LOAD, STORE, Runs, make_runs, split_runs
from kvtiers.swap.swap_job import SwapJob


class _Native(Protocol):
    """What `kvtiers.swap._memcpy` offers (its stub types it)."""

    def copy_batch(
        self, dst: np.ndarray, src: np.ndarray, length: np.ndarray, threads: int = 1, /
    ) -> None: ...


_memcpy: _Native | None
try:  # optional: built from setup.py where there is a C compiler
    from kvtiers.swap import _memcpy
except ImportError:  # pragma: no cover - depends on the install
    _memcpy = None

log = logging.getLogger(__name__)

__all__ = ["CpuBackend"]

_DTYPES = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.uint8}
# Runs are cut into rows of at most this size: rows must fit the copy buffer.
MAX_ROW_BYTES = 256 * 1024
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
# Jobs of at least this many bytes are shared between the job's thread and the helpers.
SPLIT_BYTES = 1024 * 1024
# ... and have rows of at least this size: jobs of small fragments (32 KiB rows) were
# measured slower when split (8.8-9.1 GB/s against 9.7-10.1 on one thread).
SPLIT_MIN_ROW = 128 * 1024
SPLIT_SHARE_BYTES = 1024 * 1024

_RowCopy = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""One region's share of a thread's copy: source rows, their indices, destination
rows, their indices."""


class CpuBackend:
    """Runs jobs on two threads (store, load). `submit` never blocks on a copy."""

    kind = "cpu"
    available = ("cpu",)

    def __init__(
        self,
        groups: Sequence[tuple[KVLayout, torch.Tensor]],
        rank: int,
        chunk_bytes: int,
        threads: int | None = None,
    ):
        self._groups = groups  # (layout, pool tensor [num_slots, slot_bytes] uint8)
        self._rank = rank
        self._chunk_bytes = max(8, chunk_bytes)
        # numpy's copies run on one core: a large job is split over `threads` (the
        # job's own thread plus helpers), as a plain copy_ uses every core.
        n = threads if threads is not None else min(2, os.cpu_count() or 1)
        self._helpers = ThreadPoolExecutor(n - 1, "kvtiers-swap-copy") if n > 1 else None
        self._finished: deque[SwapJob] = deque()
        self._cond = threading.Condition()
        # A None in a queue stops its thread.
        self._queues: dict[str, queue.SimpleQueue[SwapJob | None]] = {
            STORE: queue.SimpleQueue(),
            LOAD: queue.SimpleQueue(),
        }
        self._threads = {
            d: threading.Thread(target=self._run, args=(d,), name=f"kvtiers-swap-{d}", daemon=True)
            for d in (STORE, LOAD)
        }
        self._closing = False
        for t in self._threads.values():
            t.start()

    # ---------------------------------------------------------------- contract

    def submit(self, job: SwapJob, method: str) -> None:
        job.method = "cpu"
        self._queues[job.direction].put(job)

    def poll(self) -> list[SwapJob]:
        out = []
        while self._finished:
            out.append(self._finished.popleft())
        return out

    def wait(self, job: SwapJob, timeout: float | None) -> bool:
        return job.done.wait(timeout)

    def close(self) -> None:
        """Stop the threads; jobs still queued finish as closed, the running one ends."""
        self._closing = True
        for q in self._queues.values():
            q.put(None)
        for t in self._threads.values():
            t.join()
        if self._helpers is not None:
            self._helpers.shutdown()

    # ---------------------------------------------------------------- internal

    def _run(self, direction: str) -> None:
        q = self._queues[direction]
        temp: np.ndarray | None = None
        while True:
            job = q.get()
            if job is None:
                return
            if self._closing:
                job.closed = True
            else:
                t0 = time.perf_counter()
                try:
                    temp = self._execute(job, temp)
                except Exception as e:  # noqa: BLE001 - in the job's result, never raised
                    log.warning("swap job %s failed: %r", job.job_id, e)
                    job.error = f"{type(e).__name__}: {e}"
                job.seconds = time.perf_counter() - t0
            self._finished.append(job)
            job.done.set()

    def _execute(self, job: SwapJob, temp: np.ndarray | None) -> np.ndarray | None:
        layout, pool = self._groups[job.group]
        check = job.check
        slot_bytes = pool.shape[1]
        offsets = check.slots * slot_bytes + self._rank * layout.rank_bytes
        runs = make_runs(layout, check.pages, offsets)
        if len(runs) == 0:
            return temp
        flat_pool = pool.reshape(-1)
        if temp is None:
            temp = np.empty(self._chunk_bytes, dtype=np.uint8)
        copy_runs(layout.regions, flat_pool, runs, job.direction == STORE, temp, self._helpers)
        return temp


def copy_runs(
    regions: list[torch.Tensor],
    buffer: torch.Tensor,
    runs: Runs,
    to_buffer: bool,
    temp: np.ndarray,
    helpers: ThreadPoolExecutor | None = None,
) -> None:
    """Copy `runs` between flat uint8 `regions` and the flat uint8 `buffer`
    (`to_buffer`: region -> buffer), through `temp` (a uint8 buffer); copies of at
    least `SPLIT_BYTES` are shared with the `helpers` threads, each thread taking an
    equal share of every region's rows and of `temp`. With the native helper, the
    whole job is one `copy_batch` call and `temp` is not used."""
    native = _memcpy
    if native is not None:
        threads = 1
        if helpers is not None and runs.nbytes >= SPLIT_BYTES:
            threads = min(2, helpers._max_workers + 1)
        _copy_native(native, regions, buffer, runs, to_buffer, threads)
        return
    lengths = runs.length
    word = math.gcd(
        8,
        int(np.gcd.reduce(lengths)),
        int(np.gcd.reduce(runs.engine)),
        int(np.gcd.reduce(runs.buffer)),
    )
    row = math.gcd(int(np.gcd.reduce(lengths)), MAX_ROW_BYTES)  # a multiple of word
    pieces = split_runs(runs, row)
    dtype = _DTYPES[word]
    row_words = row // word
    buf_words = _words(buffer, word, dtype)
    parts = 1 if helpers is None else helpers._max_workers + 1
    if parts > 1 and (
        pieces.nbytes < SPLIT_BYTES or row < SPLIT_MIN_ROW or len(temp) < parts * row
    ):
        parts = 1
    if len(temp) < row:  # a buffer smaller than one row still moves one row at a time
        temp = np.empty(row, np.uint8)
    # split: each thread's share stays within its core's L2 (1 MiB here)
    share = (len(temp) if parts == 1 else min(len(temp) // parts, SPLIT_SHARE_BYTES)) // row * row
    temps = [
        temp[k * share : (k + 1) * share].view(dtype).reshape(-1, row_words) for k in range(parts)
    ]
    work: list[list[_RowCopy]] = [[] for _ in range(parts)]  # per thread
    for rid in _unique(pieces.region):
        sel = pieces.region == rid if len(regions) > 1 else slice(None)
        eng_off = pieces.engine[sel] // word
        buf_off = pieces.buffer[sel] // word
        eng_rows, eng_idx = _rows(_words(regions[rid], word, dtype), eng_off, row_words)
        buf_rows, buf_idx = _rows(buf_words, buf_off, row_words)
        if to_buffer:
            src, src_idx, dst, dst_idx = eng_rows, eng_idx, buf_rows, buf_idx
        else:
            src, src_idx, dst, dst_idx = buf_rows, buf_idx, eng_rows, eng_idx
        cuts = np.linspace(0, len(src_idx), parts + 1).astype(int).tolist()
        for k in range(parts):  # threads, not blocks
            lo, hi = cuts[k], cuts[k + 1]
            if hi > lo:
                work[k].append((src, src_idx[lo:hi], dst, dst_idx[lo:hi]))
    futures = (
        [helpers.submit(_copy_rows, work[k], temps[k]) for k in range(1, parts)]
        if helpers is not None  # parts > 1 only with helpers
        else []
    )
    try:
        _copy_rows(work[0], temps[0])
    finally:  # `temp` is reused by the next job: the helpers must be done with it
        for f in futures:
            f.result()


def _copy_native(
    native: _Native,
    regions: list[torch.Tensor],
    buffer: torch.Tensor,
    runs: Runs,
    to_buffer: bool,
    threads: int,
) -> None:
    """One `copy_batch` call for the whole job, on absolute addresses. The planner
    validated pages and slots; the bounds are checked again here (vectorised), so that
    a bug can never make the native copy write outside the region or the buffer."""
    if len(runs) == 0:
        return
    n = len(regions)
    bases = np.fromiter((r.data_ptr() for r in regions), np.int64, n)
    sizes = np.fromiter((r.numel() * r.element_size() for r in regions), np.int64, n)
    region, engine, offset = runs.region, runs.engine, runs.buffer
    length = np.ascontiguousarray(runs.length, dtype=np.int64)
    if (
        int(region.min()) < 0
        or int(region.max()) >= n
        or int(length.min()) < 0
        or int(engine.min()) < 0
        or int(offset.min()) < 0
        or bool((engine + length > sizes[region]).any())
        or int((offset + length).max()) > buffer.numel() * buffer.element_size()
    ):
        raise RuntimeError("copy runs reach outside the engine regions or the buffer")
    eng = bases[region] + engine
    buf = offset + buffer.data_ptr()
    dst, src = (buf, eng) if to_buffer else (eng, buf)
    native.copy_batch(dst, src, length, threads)


def _copy_rows(work: list[_RowCopy], temp: np.ndarray) -> None:
    for src, src_idx, dst, dst_idx in work:  # one item per region
        _gather_scatter(src, src_idx, dst, dst_idx, temp)


def _unique(values: np.ndarray) -> Iterable[int]:
    if len(values) and values.min() == values.max():
        return [int(values[0])]
    distinct: list[int] = np.unique(values).tolist()
    return distinct


def _words(flat_u8: torch.Tensor, word: int, dtype: type) -> np.ndarray:
    n = flat_u8.numel() // word * word
    return flat_u8[:n].numpy().view(dtype)


def _rows(words: np.ndarray, offsets: np.ndarray, row_words: int) -> tuple[np.ndarray, np.ndarray]:
    """A `[n, row_words]` window view over `words` whose row `i` starts at word
    `i * step` (step: the largest that divides every offset), and the row indices."""
    step = math.gcd(int(np.gcd.reduce(offsets)), row_words) if len(offsets) else row_words
    step = step or row_words
    nrows = (len(words) - row_words) // step + 1
    item = words.itemsize
    view = np.lib.stride_tricks.as_strided(words, (nrows, row_words), (step * item, item))
    return view, offsets // step


def _consecutive(idx: np.ndarray) -> bool:
    return (
        len(idx) > 0
        and int(idx[-1]) - int(idx[0]) == len(idx) - 1
        and bool((np.diff(idx) == 1).all())
    )


def _gather_scatter(
    src: np.ndarray, src_idx: np.ndarray, dst: np.ndarray, dst_idx: np.ndarray, temp: np.ndarray
) -> None:
    # Indices were validated by the planner: mode="clip" skips numpy's own check,
    # which would otherwise buffer the whole output.
    n = len(src_idx)
    if _consecutive(src_idx):  # one pass, straight from the source rows
        i0 = int(src_idx[0])
        dst[dst_idx] = src[i0 : i0 + n]
        return
    if _consecutive(dst_idx):  # one pass, straight into the destination rows
        i0 = int(dst_idx[0])
        np.take(src, src_idx, axis=0, out=dst[i0 : i0 + n], mode="clip")
        return
    per = temp.shape[0]
    for start in range(0, n, per):  # chunks of the reusable buffer, not blocks
        s = src_idx[start : start + per]
        t = temp[: len(s)]
        np.take(src, s, axis=0, out=t, mode="clip")
        dst[dst_idx[start : start + per]] = t
