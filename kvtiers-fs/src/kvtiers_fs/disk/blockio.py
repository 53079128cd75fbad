"""Moving one block between a pool slot and its file, on an I/O thread.

One `pwritev`/`preadv` per block: the header page (a per-thread aligned buffer) and
the slot itself (a memoryview of the pool, 4 KiB aligned) in one call, so the block
bytes are never copied in Python. A block whose size is not a multiple of 4 KiB
has its last partial page staged through a second per-thread page (a copy of less
than 4 KiB), so that O_DIRECT transfers stay aligned and a load never writes the
slot's padding. The checksum is computed here, from the slot bytes being written,
and verified here, on the bytes placed in the slot, before a load counts as done.

A block becomes visible only complete: it is written under a temporary name and
renamed with RENAME_NOREPLACE (link+unlink where the filesystem lacks it). A file
already at the name is verified: the same block is kept, anything else (damage, a
foreign or stale file) is replaced by one atomic rename - never truncated or
overwritten in place. `durable` adds fsync of the file before the rename and of
the directory after.

Everything here raises OSError on I/O errors; the caller turns them into per-key
failures.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import importlib
import mmap
import os
import stat
import threading
from dataclasses import dataclass
from typing import Any

from kvtiers.sdk import checksum

from kvtiers_fs.disk import layout
from kvtiers_fs.disk.layout import ALIGN, HEADER_BYTES, HeaderError

O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100



def _native() -> Any:
    """The optional native helper (setup.py): a batch of loads, one GIL release;
    None where it was not built (no C compiler found)."""
    try:  # by name: a C module, which mypy cannot see (kvtiers-fs/setup.py builds it)
        return importlib.import_module("kvtiers_fs.disk._readmany")
    except ImportError:  # pragma: no cover - not built
        return None


_readmany: Any = _native()
_renameat2: Any
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _renameat2 = _libc.renameat2
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
    _renameat2.restype = ctypes.c_int
except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
    _renameat2 = None


class ReadOutcome(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # no file
    CORRUPT = "corrupt"  # a file at our name that is not a valid copy of this block
    FOREIGN = "foreign"  # an intact header of another layout version or namespace


@dataclass(frozen=True, slots=True)
class ReadResult:
    outcome: ReadOutcome
    why: str = ""


_local = threading.local()


def _pages() -> tuple[memoryview, memoryview]:
    """This thread's aligned header page and tail page (mmap is page aligned)."""
    pages = getattr(_local, "pages", None)
    if pages is None:
        buf = mmap.mmap(-1, 2 * ALIGN)
        mv = memoryview(buf)
        pages = _local.pages = (mv[:ALIGN], mv[ALIGN:])
        _local.buf = buf
    return pages


def _batch_pages(n: int) -> list[memoryview]:
    """This thread's 2n aligned pages (header and tail of n blocks), kept and grown."""
    pages = getattr(_local, "batch", None)
    if pages is None or len(pages) < 2 * n:
        buf = mmap.mmap(-1, 2 * n * ALIGN)
        mv = memoryview(buf)
        pages = _local.batch = [mv[i * ALIGN : (i + 1) * ALIGN] for i in range(2 * n)]
        _local.batch_buf = buf
    return pages


class BlockIO:
    """Reads and writes block files of one size in one namespace. Thread-safe."""

    def __init__(self, namespace: str, block_bytes: int, *, o_direct: bool, durable: bool):
        self.namespace = namespace
        self.block_bytes = block_bytes
        self.o_direct = o_direct
        self.durable = durable
        self.file_bytes = layout.file_bytes(block_bytes)
        self._floor = block_bytes - block_bytes % ALIGN  # aligned part of the block
        self._tail = block_bytes - self._floor  # bytes staged through the tail page
        self._direct = O_DIRECT if o_direct else 0

    # -- store ------------------------------------------------------------------

    def write(self, shard_fd: int, idn: bytes, key: bytes, writer: int,
              block: memoryview, recycled: bool = False) -> None:
        """Write `block` (a slot's block bytes) as the file of `idn`; visible only once
        complete. The caller holds the intent for `idn` (no other writer writes that
        name meanwhile). A file already at the name is kept only if it is a valid
        copy of this very block (read and verified); anything else there is
        replaced. `recycled`: an evicted block's file waits at the temporary name
        (see `BlockDir.recycle`); overwrite it whole rather than create a file."""
        header, tail = _pages()
        digest = checksum(block)
        raw = layout.pack_header(key, self.namespace, self.block_bytes, digest)
        header[: len(raw)] = raw
        header[len(raw) :] = bytes(ALIGN - len(raw))
        buffers = [header, block[: self._floor]] if self._floor else [header]
        if self._tail:
            tail[: self._tail] = block[self._floor :]
            tail[self._tail :] = bytes(ALIGN - self._tail)
            buffers.append(tail)
        tmp = layout.tmp_name(idn, writer)
        fd = self._open_tmp(tmp, shard_fd, recycled)
        try:
            _pwritev_all(fd, buffers, 0)
            if self.durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            layout.unlink_quiet(tmp, shard_fd)
            raise
        os.close(fd)
        name = layout.block_name(idn)
        try:
            try:
                rename_noreplace(shard_fd, tmp, name)
            except FileExistsError:
                # The caller holds the only intent for this name, so whatever is there
                # is no other writer's work in progress: a stale copy, or damage, or a
                # foreign file (another namespace's, another layout's). Keep it only if
                # it is this very block, verified; else it is ours to replace.
                if verify_block_file(shard_fd, name, self.namespace, idn, self.file_bytes,
                                     key=key, digest=digest) is None:
                    layout.unlink_quiet(tmp, shard_fd)
                else:
                    os.rename(tmp, name, src_dir_fd=shard_fd, dst_dir_fd=shard_fd)
        except BaseException:
            layout.unlink_quiet(tmp, shard_fd)
            raise
        if self.durable:
            os.fsync(shard_fd)

    def _open_tmp(self, tmp: str, shard_fd: int, recycled: bool) -> int:
        """The temporary file to write: the recycled one when it is there, regular
        and of the block file's size; else a new one (O_EXCL)."""
        flags = os.O_WRONLY | self._direct
        if recycled:
            try:  # O_NONBLOCK: a FIFO planted there must not hang the thread
                fd = layout.open_file(tmp, shard_fd, flags | os.O_NONBLOCK)
            except FileNotFoundError:
                pass
            else:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_size == self.file_bytes:
                    return fd  # every byte of it is written below
                os.close(fd)
                layout.unlink_quiet(tmp, shard_fd)
        return layout.open_file(tmp, shard_fd, flags | os.O_CREAT | os.O_EXCL)

    # -- load -------------------------------------------------------------------

    def read(self, shard_fd: int, idn: bytes, key: bytes, block: memoryview) -> ReadResult:
        """Read the file of `idn` into `block` and verify it. Only OK means the slot
        holds this block's bytes; otherwise the slot (never anything outside it) may
        hold anything."""
        try:
            # O_NONBLOCK: a FIFO planted at our name must not hang the thread.
            fd = layout.open_file(layout.block_name(idn), shard_fd,
                                  os.O_RDONLY | os.O_NONBLOCK | self._direct)
        except FileNotFoundError:
            return ReadResult(ReadOutcome.MISSING)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR):
                return ReadResult(ReadOutcome.CORRUPT, "not a regular file (symlink?)")
            if exc.errno == errno.EINVAL and not _is_regular_at(layout.block_name(idn), shard_fd):
                return ReadResult(ReadOutcome.CORRUPT, "not a regular file")  # O_DIRECT FIFO
            raise
        return self._read_fd(fd, key, block, shard_fd, layout.block_name(idn))

    def read_beneath(self, blocks_fd: int, idn: bytes, key: bytes,
                     block: memoryview) -> ReadResult | None:
        """`read`, opening `<shard>/<file>` relative to the blocks directory in one
        openat2 call (no symlink followed anywhere on the path). None - nothing
        read - when openat2 is unavailable or the open failed other than with
        ENOENT: the caller then takes the two-step path (`read`), which tells a
        symlinked shard from a symlinked file."""
        path = layout.block_relpath(idn)
        try:
            fd = layout.open_beneath(path, blocks_fd, os.O_RDONLY | os.O_NONBLOCK | self._direct)
        except FileNotFoundError:
            return ReadResult(ReadOutcome.MISSING)  # no file, or no shard directory
        except OSError:
            return None
        if fd is None:
            return None
        return self._read_fd(fd, key, block, blocks_fd, path)

    def _read_fd(self, fd: int, key: bytes, block: memoryview, dir_fd: int,
                 path: str) -> ReadResult:
        """Read and verify an open block file (`path` in `dir_fd`); closes `fd`.

        A file that fails verification is CORRUPT only if `path` still names it
        afterwards. Otherwise the block was evicted while we read - by another
        process, whose eviction may hand the file to a new block (`BlockDir.
        recycle`) - and the answer is MISSING: nothing to count, nothing to delete."""
        header, tail = _pages()
        try:
            st = os.fstat(fd)
            got = self._check_file(st.st_mode, st.st_size)
            if got is None:
                nread = _preadv_all(fd, self._vecs(header, tail, block), 0)
                got = self._check_bytes(nread, header, tail, key, block)
        finally:
            os.close(fd)
        return _unless_replaced(got, dir_fd, path, (st.st_dev, st.st_ino))

    def read_many(self, blocks_fd: int, items: list[tuple[bytes, bytes, memoryview]]
                  ) -> list[ReadResult | None]:
        """`read_beneath` for a batch of (ident, key, block), in one native call that
        opens and reads every file without the GIL (small blocks: a few µs of Python
        per block instead of four GIL round trips). None for a block means "not
        read here": no native helper, or an error the per-block path classifies."""
        if _readmany is None or not layout.has_openat2() or not items:
            return [None] * len(items)
        pages = _batch_pages(len(items))
        paths, vecs = [], []
        for i, (idn, _, block) in enumerate(items):
            paths.append(layout.block_relpath(idn).encode())
            vecs.append(self._vecs(pages[2 * i], pages[2 * i + 1], block))
        flags = os.O_RDONLY | os.O_NONBLOCK | self._direct
        raw = _readmany.read_files(blocks_fd, paths, vecs, flags)
        out: list[ReadResult | None] = []
        for i, ((_, key, block), (err, mode, size, nread, dev, ino)) in enumerate(
                zip(items, raw, strict=True)):
            if err == errno.ENOENT:
                out.append(ReadResult(ReadOutcome.MISSING))
                continue
            if err:
                out.append(None)
                continue
            got = self._check_file(mode, size) or self._check_bytes(
                nread, pages[2 * i], pages[2 * i + 1], key, block)
            out.append(_unless_replaced(got, blocks_fd, paths[i].decode(), (dev, ino)))
        return out

    def _vecs(self, header: memoryview, tail: memoryview, block: memoryview) -> list[memoryview]:
        """What one preadv of a block file fills: header page, aligned part, tail."""
        vecs = [header, block[: self._floor]] if self._floor else [header]
        if self._tail:
            vecs.append(tail)
        return vecs

    def _check_file(self, mode: int, size: int) -> ReadResult | None:
        """CORRUPT for a file that cannot hold this block; None if it may."""
        if not stat.S_ISREG(mode):
            return ReadResult(ReadOutcome.CORRUPT, "not a regular file")
        if size != self.file_bytes:
            return ReadResult(ReadOutcome.CORRUPT, f"{size} bytes, expected {self.file_bytes}")
        return None

    def _check_bytes(self, nread: int, header: memoryview, tail: memoryview, key: bytes,
                     block: memoryview) -> ReadResult:
        """Verify what a read of `nread` bytes put in `header`, `block` and `tail`."""
        if nread != self.file_bytes:
            return ReadResult(ReadOutcome.CORRUPT, f"short read: {nread} bytes")
        try:
            h = layout.parse_header(header)
        except HeaderError as exc:
            outcome = ReadOutcome.FOREIGN if exc.foreign else ReadOutcome.CORRUPT
            return ReadResult(outcome, str(exc))
        if h.namespace != self.namespace:
            return ReadResult(ReadOutcome.FOREIGN, f"namespace {h.namespace}")
        if h.key != key:
            return ReadResult(ReadOutcome.CORRUPT, "header names another key")
        if h.block_bytes != self.block_bytes:
            return ReadResult(ReadOutcome.CORRUPT, f"block of {h.block_bytes} bytes")
        if self._tail:
            block[self._floor :] = tail[: self._tail]
        if checksum(block) != h.checksum:
            return ReadResult(ReadOutcome.CORRUPT, "checksum mismatch")
        return _OK


def verify_block_file(dir_fd: int, name: str, namespace: str, idn: bytes, file_size: int,
                      *, key: bytes | None = None, digest: int | None = None) -> str | None:
    """None if `name` in `dir_fd` is a regular file of `file_size` bytes holding a
    valid block of `namespace` whose key has ident `idn` (and is `key`, and whose
    checksum is `digest`, when given) - header and block bytes verified; else why
    not. Reads the whole file (buffered, into a private buffer): for the rare
    cases that need it (a dead writer's file, a file found at a new block's name)."""
    try:
        fd = layout.open_file(name, dir_fd, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return "no file"
    except OSError as exc:
        return f"cannot open: {exc.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_size != file_size:
            return f"{st.st_size} bytes, expected {file_size}"
        data = os.pread(fd, file_size, 0)
    except OSError as exc:
        return f"cannot read: {exc.strerror}"
    finally:
        os.close(fd)
    if len(data) != file_size:
        return "short read"
    try:
        h = layout.parse_header(data[:HEADER_BYTES])
    except HeaderError as exc:
        return str(exc)
    if h.namespace != namespace:
        return f"namespace {h.namespace}"
    if layout.ident(h.key) != idn or (key is not None and h.key != key):
        return "header names another key"
    if layout.file_bytes(h.block_bytes) != file_size:
        return f"block of {h.block_bytes} bytes"
    if digest is not None and h.checksum != digest:
        return "another block's checksum"
    view = memoryview(data)[HEADER_BYTES : HEADER_BYTES + h.block_bytes]
    if checksum(view) != h.checksum:
        return "checksum mismatch"
    return None


def _unless_replaced(got: ReadResult, dir_fd: int, path: str,
                     inode: tuple[int, int]) -> ReadResult:
    """`got`, but MISSING for a CORRUPT file that `path` no longer names (see
    `BlockIO._read_fd`)."""
    if got.outcome is ReadOutcome.CORRUPT and not _still_names(dir_fd, path, inode):
        return ReadResult(ReadOutcome.MISSING, "evicted while being read")
    return got


def _still_names(dir_fd: int, path: str, inode: tuple[int, int]) -> bool:
    """Whether `path` in `dir_fd` is still the file (device, inode) `inode`."""
    try:
        now = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == inode


_OK = ReadResult(ReadOutcome.OK)


def _is_regular_at(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _pwritev_all(fd: int, buffers: list[memoryview], offset: int) -> None:
    """pwritev until everything is written (a full disk shows as a short write, then
    ENOSPC)."""
    while buffers:
        n = os.pwritev(fd, buffers, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        offset += n
        buffers = _advance(buffers, n)


def _preadv_all(fd: int, buffers: list[memoryview], offset: int) -> int:
    total = 0
    while buffers:
        n = os.preadv(fd, buffers, offset)
        if n <= 0:
            break  # end of file: the caller compares the total with the file size
        total += n
        offset += n
        buffers = _advance(buffers, n)
    return total


def _advance(buffers: list[memoryview], n: int) -> list[memoryview]:
    """What is left of `buffers` once a vectored call moved `n` bytes."""
    while buffers and n >= len(buffers[0]):
        n -= len(buffers[0])
        buffers = buffers[1:]
    return [buffers[0][n:], *buffers[1:]] if n else buffers


def rename_noreplace(dir_fd: int, src: str, dst: str) -> None:
    """Rename `src` to `dst` within `dir_fd`; FileExistsError if `dst` exists."""
    if _renameat2 is not None:
        if _renameat2(dir_fd, src.encode(), dir_fd, dst.encode(), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), dst)
    # Filesystems without RENAME_NOREPLACE: a hard link also refuses to replace.
    os.link(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    layout.unlink_quiet(src, dir_fd)


def probe_o_direct(dir_fd: int) -> bool:
    """True when files in `dir_fd` can be written and read back with O_DIRECT."""
    if not O_DIRECT:
        return False
    name = f".odirect-probe.{os.getpid()}.{os.urandom(4).hex()}{layout.TMP_SUFFIX}"
    try:
        fd = layout.open_file(name, dir_fd, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_DIRECT)
    except OSError:
        return False
    out, back = mmap.mmap(-1, ALIGN), mmap.mmap(-1, ALIGN)
    out[:] = os.urandom(ALIGN)
    try:
        with memoryview(out) as src, memoryview(back) as dst:
            return (os.pwritev(fd, [src], 0) == ALIGN
                    and os.preadv(fd, [dst], 0) == ALIGN and back[:] == out[:])
    except OSError:
        return False
    finally:
        os.close(fd)
        layout.unlink_quiet(name, dir_fd)
        out.close()
        back.close()


__all__ = ["HEADER_BYTES", "BlockIO", "ReadOutcome", "ReadResult", "probe_o_direct",
           "rename_noreplace", "verify_block_file"]
