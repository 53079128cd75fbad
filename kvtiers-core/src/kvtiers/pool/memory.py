"""Where a CPU pool's bytes live, and whether the machine can hold them.

Two backings:

- **anonymous** (`shared=False`): a private anonymous mapping, for a pool used by one
  process only.
- **shared** (`shared=True`): a file under /dev/shm that the scheduler process creates
  and the GPU worker processes map. The file is the slots followed by one 4 KiB header
  page (`PoolHeader`) that tells an attacher the geometry, so a worker that expects
  another block size is refused instead of reading the wrong bytes. The creator writes
  the header last: a file without it is a pool still being prepared (or whose creator
  died while preparing it).

Size checks run before anything is allocated (`check_pool_fits`). Which numbers
refuse, and why:

- physical RAM (`MemTotal`) and the cgroup memory limit: a pool above them can never
  exist;
- `MemAvailable`: the kernel's estimate of what can still be allocated without
  swapping, reclaimable page cache included. Pool pages are pinned (registered for
  DMA) or tmpfs pages on machines without swap: they cannot be reclaimed, so a pool
  above `MemAvailable` does not fail at creation — it ends later, mid-serving, in the
  OOM killer or a SIGBUS on a /dev/shm page. Refusing at start is the honest answer;
- for shared pools, /dev/shm's free space (`statvfs`), since tmpfs has its own size
  limit (half of RAM by default, 64 MiB in a default Docker container).
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass

from kvtiers.contract.pool_view import ALIGN
from kvtiers.errors import KvtiersError
from kvtiers.humanize import format_bytes

PAGE = mmap.PAGESIZE
HEADER_BYTES = 4096  # one page after the slots; keeps the slots' alignment intact
SHM_DIR = "/dev/shm"
FILE_PREFIX = "kvtiers-"

_MAGIC = b"KVTPOOL\x00"
_HEADER_VERSION = 1
# magic, header version, reserved, block_bytes, slot_bytes, num_slots
_HEADER = struct.Struct("<8sIIQQQ")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


class PoolError(KvtiersError):
    """Base class of the CPU pool's errors."""


class PoolSizeError(PoolError, ValueError):
    """The requested pool cannot exist on this machine (or holds zero slots). Raised
    before anything is allocated; the message says what to change."""


class PoolAttachError(PoolError, ValueError):
    """A shared pool exists but is not what the attacher expects (another block size
    or slot count), is not a kvtiers pool, or is still being prepared."""


class PinError(PoolError, RuntimeError):
    """The pool cannot be registered with CUDA (no CUDA, or the driver refused)."""


human_bytes = format_bytes  # kept as the pool modules' name for it


# ---------------------------------------------------------------------------- limits


@dataclass(frozen=True, slots=True)
class MemoryLimits:
    """What this process may allocate, in bytes."""

    physical: int  # MemTotal
    available: int  # MemAvailable
    cgroup: int | None  # the cgroup's memory limit; None when unlimited or unknown


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo's fields in bytes (the file says kB, meaning KiB)."""
    fields: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
                fields[name] = int(parts[0]) * scale
    return fields


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 `memory.max`, v1
    `memory.limit_in_bytes`), or None. Containers (Kubernetes pods) are usually
    limited far below the host's RAM, which /proc/meminfo still reports."""
    candidates: list[str] = []
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    candidates.append(f"/sys/fs/cgroup{path}/memory.max")
                elif "memory" in controllers.split(","):
                    candidates.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    except (OSError, ValueError):
        pass
    # Inside a cgroup namespace the paths above may not resolve; the mount root is then
    # the process's own cgroup.
    candidates += ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
    for candidate in candidates:
        try:
            with open(candidate) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text == "max":
            return None
        if text.isdigit():
            value = int(text)
            # cgroup v1 spells "unlimited" as a page-rounded 2**63 - 1.
            return None if value >= 1 << 62 else value
    return None


def memory_limits() -> MemoryLimits:
    info = read_meminfo()
    physical = info.get("MemTotal") or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return MemoryLimits(physical, info.get("MemAvailable", physical), _cgroup_limit())


def shm_space(shm_dir: str) -> tuple[int, int]:
    """(free, total) bytes of the filesystem holding `shm_dir`."""
    st = os.statvfs(shm_dir)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def check_pool_fits(nbytes: int, *, shm_dir: str | None, what: str = "the CPU pool") -> None:
    """Raise `PoolSizeError` unless `nbytes` of new pool memory (plus, for a shared
    pool, a file of that size in `shm_dir`) can be allocated now. Allocates nothing."""
    limits = memory_limits()
    ask = f"{what} needs {human_bytes(nbytes)} ({nbytes} bytes)"
    fix = "lower cpu_bytes_to_use"
    if nbytes > limits.physical:
        raise PoolSizeError(
            f"{ask}, more than this machine's physical memory "
            f"({human_bytes(limits.physical)}): {fix} below that"
        )
    if limits.cgroup is not None and nbytes > limits.cgroup:
        raise PoolSizeError(
            f"{ask}, more than this process's cgroup memory limit "
            f"({human_bytes(limits.cgroup)}): {fix}, or raise the container's memory limit"
        )
    if nbytes > limits.available:
        raise PoolSizeError(
            f"{ask}, but only {human_bytes(limits.available)} of "
            f"{human_bytes(limits.physical)} is available now (MemAvailable): {fix} to "
            f"at most {human_bytes(limits.available)}, or free memory first (pool pages "
            f"cannot be swapped or reclaimed, so a larger pool would end in the OOM killer)"
        )
    if shm_dir is not None:
        free, total = shm_space(shm_dir)
        if nbytes > free:
            raise PoolSizeError(
                f"{ask} in {shm_dir}, which has {human_bytes(free)} free of "
                f"{human_bytes(total)}: {fix}, or enlarge {shm_dir} "
                f"(`mount -o remount,size=... {shm_dir}`; Docker: --shm-size)"
            )


# --------------------------------------------------------------------------- backing


@dataclass(frozen=True, slots=True)
class PoolHeader:
    block_bytes: int
    slot_bytes: int
    num_slots: int

    @property
    def nbytes(self) -> int:
        return self.slot_bytes * self.num_slots


@dataclass
class Backing:
    """One mapping of pool memory: `nbytes` of slots (then, for a shm file, the
    header page). `fd` stays open only while the creator reserves the file's pages."""

    mm: mmap.mmap
    nbytes: int
    path: str | None = None  # the shm file; None for anonymous memory
    owner: bool = True  # created it: unlinks the file on close
    fd: int | None = None

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def shm_path(name: str, shm_dir: str = SHM_DIR) -> str:
    """The file of the shared pool called `name`. Names are restricted to a safe
    alphabet so that a name can never point outside `shm_dir`."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"pool name must be 1-200 characters of letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit; got {name!r}"
        )
    return os.path.join(shm_dir, FILE_PREFIX + name)


def create_anonymous(nbytes: int) -> Backing:
    # MAP_PRIVATE, not Python's default MAP_SHARED: shared anonymous memory is shmem
    # (counted as Shmem, no transparent huge pages), which nothing here needs.
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    advise_huge_pages(mm)
    return Backing(mm, nbytes)


def advise_huge_pages(mm: mmap.mmap) -> bool:
    """Ask for transparent huge pages (before the pages exist). With 2 MiB pages a
    slot is a few physically contiguous ranges instead of hundreds of 4 KiB pages,
    so an O_DIRECT transfer of a block is one or two device requests rather than
    several requests of up to 254 segments each (on the development VM: +36% for
    cold 2 MiB reads from ext4, +32% for overwrites; bench/pool_pages_io.py), and
    copies take fewer TLB misses. A no-op where THP is off ("never") or unsupported.
    True if the kernel took the advice."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return False
    try:
        mm.madvise(advice)
    except OSError:
        return False
    return True


def create_shm(path: str, nbytes: int) -> Backing:
    """Create `path` (never an existing file: O_EXCL, which also refuses a symlink)
    with mode 0600, sized for `nbytes` of slots plus the header page, and map it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, nbytes + HEADER_BYTES)
        mm = mmap.mmap(fd, nbytes + HEADER_BYTES, flags=mmap.MAP_SHARED)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return Backing(mm, nbytes, path=path, owner=True, fd=fd)


def reserve(backing: Backing, start: int, length: int) -> bool:
    """Allocate the file's pages for [start, start + length) now, so that a full
    /dev/shm is an error here rather than a SIGBUS when a page is first touched.
    Returns False when the filesystem cannot reserve (nothing more to do then)."""
    assert backing.fd is not None
    try:
        os.posix_fallocate(backing.fd, start, length)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return False
        if e.errno == errno.ENOSPC:
            raise PoolSizeError(
                f"{os.path.dirname(backing.path or '')} filled up while the pool "
                f"({human_bytes(backing.nbytes)}) was being reserved: something else "
                f"is using it; lower cpu_bytes_to_use or enlarge it"
            ) from e
        raise
    return True


def open_shm(path: str) -> tuple[Backing, PoolHeader]:
    """Map an existing shared pool and read its header. Does not follow symlinks."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT,
            "no shared CPU pool with this name (was it created, with the same shm_dir, "
            "and is its creator still running?)",
            path,
        ) from None
    try:
        st = os.fstat(fd)
        size = st.st_size
        if not stat.S_ISREG(st.st_mode) or size < HEADER_BYTES + ALIGN or size % ALIGN:
            raise PoolAttachError(f"{path} is not a kvtiers CPU pool (size {size} bytes)")
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    header = _read_header(mm, size - HEADER_BYTES, path)
    return Backing(mm, header.nbytes, path=path, owner=False), header


def write_header(backing: Backing, header: PoolHeader) -> None:
    """Publish the pool to attachers: the fields first, the magic last."""
    off = backing.nbytes
    packed = _HEADER.pack(
        _MAGIC, _HEADER_VERSION, 0, header.block_bytes, header.slot_bytes, header.num_slots
    )
    backing.mm[off + 8 : off + _HEADER.size] = packed[8:]
    backing.mm[off : off + 8] = packed[:8]


def _read_header(mm: mmap.mmap, off: int, path: str) -> PoolHeader:
    magic, version, _, block_bytes, slot_bytes, num_slots = _HEADER.unpack_from(mm, off)
    problem = None
    if magic == b"\x00" * 8:
        problem = (
            "is not ready: its creator is still preparing it (or died while doing so; "
            "then remove the file)"
        )
    elif magic != _MAGIC:
        problem = "is not a kvtiers CPU pool"
    elif version != _HEADER_VERSION:
        problem = f"has header version {version}; this kvtiers reads {_HEADER_VERSION}"
    elif slot_bytes * num_slots != off or slot_bytes % ALIGN or not 0 < block_bytes <= slot_bytes:
        problem = "has an inconsistent header"
    if problem:
        mm.close()
        raise PoolAttachError(f"{path} {problem}")
    return PoolHeader(block_bytes, slot_bytes, num_slots)
