"""Where things live under a root directory, the block file format, and the only
ways this package opens, creates and removes paths (never following a symlink).

Tree (one per root; directories 0700, files 0600)::

    ROOT/
      <fingerprint>/                 one namespace (Namespace.fingerprint, 32 hex)
        NAMESPACE.json               model, revision, geometry: for `list_namespaces`
        lock                         flock(2) target: one writer of the journal at a time
        snapshot.<gen>, journal.<gen>  the index (journal/records.py, namespace/store.py)
        writers/<id>                 held locked (flock) by each live writer process
        blocks/<xyz>/<ident>.kvb     one file per block, 4096 shards by a key hash
        blocks/<xyz>/.<ident>.<writer>.tmp   a block being written (then renamed)

A block file is one 4 KiB header page followed by the block bytes, padded with zeros
to a multiple of 4 KiB, so the block bytes sit at an aligned offset and move with
O_DIRECT straight from/to a pool slot. Its size on disk is `file_bytes(block_bytes)`,
which is also what the tier counts against `capacity_bytes`.

Header (little-endian; offsets in bytes):

    0  magic "KVTIERFS"           8  layout version (u32)    12  header length (u32)
   16  block bytes (u64)         24  data offset (u64, 4096)
   32  block checksum (u64: xxh3-64 of the block bytes, `kvtiers.sdk.integrity`)
   40  namespace fingerprint (32 ASCII)                     72  key length (u16)
   74  6 reserved bytes (zero)   80  the key                 80+len  xxh3-64 of bytes 0..80+len

A header is checked in this order: magic, a plausible length, its own checksum, and
only then its version - so a flipped bit anywhere (the version field included) is
damage, and "another layout version" means an intact header that says so. A header
that fails any check - damaged, another version, another namespace, another key or
length - is never taken for this block.

Symlinks: every path is opened relative to a directory descriptor with O_NOFOLLOW
(directories also with O_DIRECTORY), the root included, so a symlink anywhere in
the tree is refused (ELOOP/ENOTDIR), never followed; `unlink` of a name removes that
directory entry only. Loads open `<shard>/<file>` in one openat2(2) call with
RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH (`open_beneath`), which refuses a symlink
anywhere on the path the same way; where openat2 is missing they open the shard
directory, then the file. Nothing outside a namespace directory is ever removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
import threading
from dataclasses import dataclass
from typing import Any

import xxhash
from kvtiers.sdk import BlockKey

ALIGN = 4096
HEADER_BYTES = 4096  # the header page; block bytes start here
MAGIC = b"KVTIERFS"
#: the header format above (bump it when the header changes; blocks of another
#: version are never served)
LAYOUT_VERSION = 1
MAX_KEY_BYTES = 1024
#: keys up to this long are their own ident; longer ones are named by a hash
MAX_INLINE_IDENT = 40

BLOCK_SUFFIX = ".kvb"
TMP_SUFFIX = ".tmp"
SHARDS = 4096  # first 12 bits of a hash of the ident: 3 hex digits

DIR_MODE = 0o700
FILE_MODE = 0o600
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_FIXED = struct.Struct("<8sIIQQQ32sH6x")
_TAIL = struct.Struct("<Q")

Ident = bytes  # a key as the index and the file names know it (see `ident`)


def round_up(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


def file_bytes(block_bytes: int) -> int:
    """Size of a block's file: the header page plus the block rounded up to 4 KiB."""
    return HEADER_BYTES + round_up(block_bytes)


def ident(key: BlockKey) -> Ident:
    """The key itself when short (a kvtiers key is a 32-byte hash and a 4-byte group
    index: 36 bytes), else a 128-bit hash of it with a marker prefix. The full key is
    in each file's header and checked on load, so two keys sharing an ident can cost
    a miss, never wrong bytes."""
    if len(key) <= MAX_INLINE_IDENT:
        return bytes(key)
    return _HASHED + xxhash.xxh3_128_digest(key)


_HASHED = b"\x00#"
_HASHED_LEN = len(_HASHED) + 16


def key_of(idn: Ident) -> bytes | None:
    """The key an ident stands for, when the ident is the key itself; None for the
    hash of a long key (only the file's header knows it then)."""
    if len(idn) == _HASHED_LEN and idn.startswith(_HASHED):
        return None
    return idn


def shard_of(idn: Ident) -> str:
    return f"{xxhash.xxh3_64_intdigest(idn) >> 52:03x}"


def route(idn: Ident, n_roots: int) -> int:
    """Which of `n_roots` roots holds `idn` (every process must list the same roots
    in the same order)."""
    return 0 if n_roots == 1 else xxhash.xxh64_intdigest(idn) % n_roots


def block_name(idn: Ident) -> str:
    return idn.hex() + BLOCK_SUFFIX


def block_relpath(idn: Ident) -> str:
    """`<shard>/<file>` of `idn`, relative to the namespace's blocks directory."""
    return f"{shard_of(idn)}/{block_name(idn)}"


def tmp_name(idn: Ident, writer: int) -> str:
    """The temporary name of a block being written by `writer`: derived, so that a
    dead writer's leftovers are found from its journal intents without a scan."""
    return f".{idn.hex()}.{writer:016x}{TMP_SUFFIX}"


def parse_block_name(name: str) -> Ident | None:
    """The ident a block file name stands for, or None if `name` is not one this
    layout writes (lower-case hex of 1-40 bytes, then ".kvb")."""
    if not name.endswith(BLOCK_SUFFIX) or name.startswith("."):
        return None
    stem = name[: -len(BLOCK_SUFFIX)]
    if not 2 <= len(stem) <= 2 * MAX_INLINE_IDENT or not is_lower_hex(stem):
        return None
    return bytes.fromhex(stem)


def is_lower_hex(s: str) -> bool:
    """Only 0-9 and a-f (`str.isdigit` and `int()` accept far more)."""
    return s.isascii() and all(c in "0123456789abcdef" for c in s)


def writer_name(writer: int) -> str:
    return f"{writer:016x}"


def parse_writer_name(name: str) -> int | None:
    """The writer id of a `writers/` entry name (16 lower-case hex digits)."""
    if len(name) != 16 or not is_lower_hex(name):
        return None
    return int(name, 16)


def parse_tmp_name(name: str) -> int | None:
    """The writer id of a temporary block name, or None if it is not one."""
    if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
        return None
    parts = name[1 : -len(TMP_SUFFIX)].split(".")
    if len(parts) != 2:
        return None
    return parse_writer_name(parts[1])


# -- the header -----------------------------------------------------------------


def pack_header(key: BlockKey, namespace: str, block_bytes: int, checksum: int) -> bytes:
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"keys longer than {MAX_KEY_BYTES} bytes are not supported")
    fixed = _FIXED.pack(
        MAGIC,
        LAYOUT_VERSION,
        _FIXED.size + len(key) + _TAIL.size,
        block_bytes,
        HEADER_BYTES,
        checksum,
        namespace.encode("ascii"),
        len(key),
    )
    body = fixed + bytes(key)
    return body + _TAIL.pack(xxhash.xxh3_64_intdigest(body))


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    block_bytes: int
    checksum: int
    namespace: str
    key: bytes


class HeaderError(ValueError):
    """A header that is not a valid header of this layout version. `foreign` is True
    when it is intact but someone else's (another version), False when damaged."""

    def __init__(self, message: str, foreign: bool = False):
        super().__init__(message)
        self.foreign = foreign


def parse_header(page: bytes | memoryview) -> Header:
    """Decode and check a header page (raises `HeaderError`). The header's own
    checksum is checked before its version: a damaged version field is damage
    (`foreign` False), not another version."""
    if len(page) < _FIXED.size + _TAIL.size:
        raise HeaderError("header truncated")
    magic, version, length, block_bytes, offset, checksum, ns, klen = _FIXED.unpack_from(page)
    if magic != MAGIC:
        raise HeaderError("not a kvtiers-fs block (bad magic)")
    if length != _FIXED.size + klen + _TAIL.size or length > min(HEADER_BYTES, len(page)):
        raise HeaderError("bad header length")
    body = bytes(page[: _FIXED.size + klen])
    (stored,) = _TAIL.unpack_from(page, _FIXED.size + klen)
    if xxhash.xxh3_64_intdigest(body) != stored:
        raise HeaderError("header checksum mismatch")
    if version != LAYOUT_VERSION:
        raise HeaderError(f"layout version {version}, not {LAYOUT_VERSION}", foreign=True)
    if offset != HEADER_BYTES:
        raise HeaderError(f"data offset {offset}, not {HEADER_BYTES}")
    try:
        namespace = ns.decode("ascii")
    except UnicodeDecodeError:
        raise HeaderError("bad namespace field") from None
    return Header(version, block_bytes, checksum, namespace, body[_FIXED.size :])


# -- safe path operations -------------------------------------------------------


def open_root(path: str) -> int:
    """A descriptor of an existing root directory; the root itself must not be a
    symlink (ELOOP)."""
    return os.open(path, DIR_FLAGS)


def open_dir(name: str, dir_fd: int, *, create: bool = False) -> int:
    """Open directory `name` in `dir_fd`, creating it 0700 if asked. Never follows a
    symlink: a symlink there raises OSError (ELOOP or ENOTDIR)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def open_file(name: str, dir_fd: int, flags: int, mode: int = FILE_MODE) -> int:
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


# openat2(2) (Linux 5.6+): one call opens `<shard>/<file>` relative to the blocks
# directory with no symlink followed anywhere on the path (RESOLVE_NO_SYMLINKS) and
# nothing resolved outside it (RESOLVE_BENEATH) - the same guarantee as opening the
# shard directory and then the file with O_NOFOLLOW, at one path walk instead of
# two opens and a close. Where the kernel (or a seccomp filter) lacks it: None, and
# callers use `open_dir` + `open_file`.
_SYS_OPENAT2 = 437  # the same number on every Linux architecture but alpha
_RESOLVE_NO_XDEV, _RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 1, 2, 4, 8
RESOLVE_STRICT = _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_SYMLINKS | _RESOLVE_BENEATH


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_syscall: Any
try:
    _syscall = ctypes.CDLL(None, use_errno=True).syscall
    _syscall.restype = ctypes.c_long
except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
    _syscall = None
_hows: dict[tuple[int, int], _OpenHow] = {}
_hows_lock = threading.Lock()
_openat2_ok: bool | None = None  # probed at first use


def _how(flags: int, mode: int) -> _OpenHow:
    how = _hows.get((flags, mode))
    if how is None:  # a handful of flag sets, built once, shared read-only
        with _hows_lock:
            how = _hows.setdefault((flags, mode), _OpenHow(flags, mode, RESOLVE_STRICT))
    return how


def _openat2(path: str, dir_fd: int, flags: int, mode: int) -> int:
    """The raw call: a descriptor, or -errno."""
    fd = _syscall(_SYS_OPENAT2, dir_fd, path.encode(), ctypes.byref(_how(flags, mode)),
                  ctypes.sizeof(_OpenHow))
    return fd if fd >= 0 else -ctypes.get_errno()


def has_openat2() -> bool:
    """Whether openat2 with RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH works here."""
    global _openat2_ok
    if _openat2_ok is None:
        ok = False
        if _syscall is not None and hasattr(os, "O_NOFOLLOW"):
            try:
                top = os.open("/", DIR_FLAGS)
            except OSError:
                top = -1
            if top >= 0:
                fd = _openat2(".", top, DIR_FLAGS, 0)
                os.close(top)
                if fd >= 0:
                    os.close(fd)
                    ok = True
        _openat2_ok = ok
    return _openat2_ok


def open_beneath(path: str, dir_fd: int, flags: int, mode: int = FILE_MODE) -> int | None:
    """Open `path` (e.g. "<shard>/<file>") relative to `dir_fd` with openat2 and
    RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH: a symlink or ".." anywhere on the path
    raises OSError (ELOOP/EXDEV), as `open_dir` + `open_file` would refuse it.
    None when openat2 is unavailable (the caller falls back to two opens)."""
    if not has_openat2():
        return None
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    mode = mode if flags & os.O_CREAT else 0
    for _ in range(4):
        fd = _openat2(path, dir_fd, flags, mode)
        if fd >= 0:
            return fd
        if fd != -errno.EAGAIN:  # EAGAIN: a rename raced the BENEATH check; retry
            break
    raise OSError(-fd, os.strerror(-fd), path)


def unlink_quiet(name: str, dir_fd: int) -> bool:
    """Remove the directory entry `name` (a symlink is removed, not its target).
    False if it was not there."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False


def close_quiet(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def write_small_file(name: str, dir_fd: int, data: bytes, *, durable: bool = False) -> None:
    """Write `data` to `name` atomically: a private temporary name, then rename."""
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}"
    fd = open_file(tmp, dir_fd, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_quiet(tmp, dir_fd)
        raise
    os.close(fd)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        unlink_quiet(tmp, dir_fd)
        raise
    if durable:
        os.fsync(dir_fd)


def read_small_file(name: str, dir_fd: int, limit: int = 1 << 20) -> bytes:
    """At most `limit` bytes of a regular file (never a FIFO, never through a link)."""
    fd = open_file(name, dir_fd, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not _is_regular(fd):
            raise OSError(errno.EINVAL, f"{name} is not a regular file")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def read_file(name: str, dir_fd: int) -> bytes:
    """A whole regular file (snapshots: tens of MiB for a million blocks)."""
    fd = open_file(name, dir_fd, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not _is_regular(fd):
            raise OSError(errno.EINVAL, f"{name} is not a regular file")
        chunks: list[bytes] = []
        offset = 0
        while True:
            chunk = os.pread(fd, max(st.st_size - offset, 1 << 16), offset)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            offset += len(chunk)
    finally:
        os.close(fd)


def _is_regular(fd: int) -> bool:
    import stat

    return stat.S_ISREG(os.fstat(fd).st_mode)
