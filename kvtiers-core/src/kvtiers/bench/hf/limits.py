"""The ceilings a reload is measured against, in the same run:

- `pinned_copy_s`: one host-to-device copy of the same number of bytes out of the
  CPU pool's own (pinned) memory into one device buffer, split into one copy per
  layer as an engine's per-layer tensors would be (and where the pool's CUDA
  registrations meet: one copy may not span two; they are 1 GiB by default);
- `disk_read` / `DiskProbe`: `dd` reading a file of the fs tier's filesystem with
  O_DIRECT in 2 MiB requests (Python's O_DIRECT read where `dd` is missing or
  refuses); a `DiskProbe` keeps its file, so that reads of the same number of bytes
  as an fs hit can be taken right before each one (a disk whose speed drifts - a
  host-cached virtual disk - is then compared with itself at the same moment).
  Each read is of cold data: the bytes it reads are first overwritten with new
  random bytes and synced (and dropped from the page cache), so no earlier read of
  them - by the host of a virtual disk, say - can serve it from a cache.
"""

from __future__ import annotations

import mmap
import os
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from kvtiers.extras import BENCH_EXTRA, missing_torch
from kvtiers.pool.pinning import registration_chunks

try:
    import torch
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc

CHUNK = 2 << 20


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pinned_copy_s(pool_tensor: torch.Tensor, nbytes: int, pieces: int, device: torch.device,
                  reps: int) -> float:
    """Median seconds to copy `nbytes` of the pool's memory to `device` in `pieces`
    copies."""
    src = pool_tensor.view(-1)[:nbytes]
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    cuts = {nbytes * i // pieces for i in range(pieces + 1)}
    chunks = registration_chunks(src.data_ptr()) if device.type == "cuda" else None
    if chunks is not None:  # a copy may not span two registrations of the pool
        base, step = chunks
        first = src.data_ptr() - base
        cuts |= {k * step - first for k in range(first // step + 1, (first + nbytes) // step + 1)
                 if 0 < k * step - first < nbytes}
    bounds = sorted(cuts)
    times = []
    for _ in range(reps + 1):  # the first one warms up
        sync(device)
        t0 = time.perf_counter()
        for a, b in zip(bounds, bounds[1:], strict=False):
            dst[a:b].copy_(src[a:b], non_blocking=True)
        sync(device)
        times.append(time.perf_counter() - t0)
    del dst
    return statistics.median(times[1:])


@dataclass
class DiskRead:
    tool: str  # "dd" or "python"
    nbytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9

    def as_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "bytes": self.nbytes, "seconds": self.seconds,
                "GB/s": self.gbps}


def median_gbps(reads: list[DiskRead]) -> float:
    return statistics.median(r.gbps for r in reads)


class DiskProbe:
    """A file of `nbytes` (random bytes, synced) under `directory`, read with
    O_DIRECT on demand; `close` removes it. One thread."""

    def __init__(self, directory: str, nbytes: int):
        self.nbytes = max(CHUNK, nbytes // CHUNK * CHUNK)
        self.path = os.path.join(directory, "kvtiers-disk-read-probe")
        try:  # its room taken now; each read writes the bytes it reads
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.nbytes)
            finally:
                os.close(fd)
        except BaseException:
            self.close()
            raise

    def _rewrite(self, nbytes: int) -> None:
        """New random bytes over the file's first `nbytes`, synced, then dropped from
        the page cache."""
        block = memoryview(os.urandom(min(nbytes, 64 << 20)))
        fd = os.open(self.path, os.O_WRONLY)
        try:
            done = 0
            while done < nbytes:
                done += os.pwrite(fd, block[: nbytes - done], done)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, nbytes, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def read(self, nbytes: int | None = None) -> DiskRead:
        """One O_DIRECT read of the file's first `nbytes` (all of it by default;
        never more than it holds), in 2 MiB requests, of bytes written (and synced)
        just before and not read since."""
        n = self.nbytes if nbytes is None else max(CHUNK, min(nbytes, self.nbytes)
                                                  // CHUNK * CHUNK)
        self._rewrite(n)
        dd = shutil.which("dd")
        if dd is not None:
            t0 = time.perf_counter()
            rc = subprocess.run([dd, f"if={self.path}", "of=/dev/null", "bs=2M",
                                 "iflag=direct", f"count={n // CHUNK}"],
                                capture_output=True).returncode
            if rc == 0:
                return DiskRead("dd", n, time.perf_counter() - t0)
        return DiskRead("python", n, _python_direct_read(self.path, n))

    def close(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)


def disk_read(directory: str, nbytes: int) -> DiskRead:
    """Write a file of `nbytes` (random bytes, synced) under `directory`, read it
    once with O_DIRECT, remove it."""
    probe = DiskProbe(directory, nbytes)
    try:
        return probe.read()
    finally:
        probe.close()


def _python_direct_read(path: str, nbytes: int) -> float:
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # a filesystem without O_DIRECT: buffered, cache dropped first
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    buf = mmap.mmap(-1, CHUNK)
    try:
        t0 = time.perf_counter()
        left = nbytes
        while left > 0:
            got = os.readv(fd, [buf])
            if got <= 0:
                break
            left -= got
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        buf.close()
