"""The files of a namespace's index: `journal.<gen>` (the open `Journal` a process
reads and appends) and `snapshot.<gen>` (written in pieces, read whole). Formats:
records.py.

Damaged or foreign names and contents are never fatal here: a name that is not a
canonical generation is not ours (`records.generation_of`); a snapshot that fails
its checks raises ValueError for the caller to rebuild from; removing old
generations skips what it cannot remove (a planted directory) and says so once.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator

import xxhash
from kvtiers.sdk import ErrorCounts

from kvtiers_fs.disk import layout
from kvtiers_fs.disk.layout import Ident
from kvtiers_fs.journal import records as jr
from kvtiers_fs.journal.records import Record, Snapshot
from kvtiers_fs.pacing import CHUNK, pause


class Journal:
    """The journal this process reads (up to `offset`, a frame boundary) and appends
    to (at `offset`, holding the namespace lock, having read to the end). Used by
    one thread at a time (the store's journal mutex)."""

    def __init__(self, ns_fd: int, errors: ErrorCounts, durable: bool):
        self._ns_fd = ns_fd
        self._errors = errors
        self.durable = durable
        self.fd = -1
        self.gen = 0
        self.offset = 0

    def switch(self, fd: int, gen: int, offset: int) -> None:
        """Continue in `fd` (journal.<gen>) from `offset`; the old one is closed."""
        if self.fd >= 0:
            layout.close_quiet(self.fd)
        self.fd, self.gen, self.offset = fd, gen, offset

    def follow(self, gen: int) -> bool:
        """Continue at the start of journal.<gen> (after its ROTATE); False if it is
        not there (we fell a generation behind: reload)."""
        try:
            fd = layout.open_file(jr.journal_name(gen), self._ns_fd, os.O_RDWR)
        except FileNotFoundError:
            return False
        self.switch(fd, gen, 0)
        return True

    def read(self) -> jr.Tail:
        """The next piece of complete frames (`records.READ_CHUNK_BYTES`)."""
        return jr.read_frames(self.fd, self.offset, jr.READ_CHUNK_BYTES)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def cut(self) -> None:
        """Drop what follows `offset` (a dead writer's torn append; lock held)."""
        os.ftruncate(self.fd, self.offset)

    def append(self, records: list[Record]) -> None:
        """One frame at `offset`; a partial append is cut off again. Raises OSError."""
        data = jr.frame(records)
        try:
            n = os.pwrite(self.fd, data, self.offset)
            if n != len(data):
                raise OSError(errno.ENOSPC, "short journal append")
            if self.durable:
                os.fdatasync(self.fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.offset)
            self._errors.record("journal", exc)
            raise
        self.offset += len(data)

    def close(self) -> None:
        if self.fd >= 0:
            layout.close_quiet(self.fd)
            self.fd = -1


def generations(ns_fd: int) -> tuple[int | None, int]:
    """(newest snapshot generation or None, highest generation named at all)."""
    newest, highest = None, 0
    for name in os.listdir(ns_fd):
        for prefix in ("snapshot", "journal"):
            g = jr.generation_of(name, prefix)
            if g is None:
                continue
            highest = max(highest, g)
            if prefix == "snapshot":
                newest = g if newest is None else max(newest, g)
    return newest, highest


def exists(ns_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=ns_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def create_journal(ns_fd: int, gen: int) -> None:
    """An empty journal.<gen> (truncated if a dead rotator left one)."""
    os.close(layout.open_file(jr.journal_name(gen), ns_fd, os.O_RDWR | os.O_CREAT | os.O_TRUNC))


def read_snapshot(ns_fd: int, gen: int) -> Snapshot:
    """snapshot.<gen>, checked. FileNotFoundError if gone; OSError or ValueError if
    unusable (not a regular file, damaged, another version, another generation)."""
    snap = jr.parse_snapshot(layout.read_file(jr.snapshot_name(gen), ns_fd))
    if snap.gen != gen:
        raise ValueError("snapshot names another generation")
    return snap


def snapshot_base(ns_fd: int, gen: int) -> int | None:
    """The base generation snapshot.<gen> names, or None when there is no such
    snapshot (or its head is unreadable). One open and a read of its head."""
    try:
        fd = layout.open_file(jr.snapshot_name(gen), ns_fd, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return jr.read_snapshot_head(os.pread(fd, jr.SNAP.size, 0)).base_gen
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def snapshot_tmp_name(gen: int, writer: int) -> str:
    """Where `writer` writes snapshot.<gen> before renaming it into place."""
    return f".{jr.snapshot_name(gen)}.{layout.writer_name(writer)}{layout.TMP_SUFFIX}"


def write_snapshot(ns_fd: int, name: str, gen: int,
                   entries: Iterable[list[tuple[Ident, int]]],
                   pending: list[tuple[Ident, tuple[int, int]]],
                   lastdel: list[tuple[int, Ident]], *, blocks: int, nbytes: int,
                   base_gen: int, base_offset: int, durable: bool) -> None:
    """Write a snapshot to `name` (a new file; the caller renames it into place).
    `entries` comes in pieces (`BlockIndex.entries`): each is packed and written
    before the next is read, so memory stays one piece and the GIL is given away in
    between. Raises OSError (the file is removed then)."""
    fd = layout.open_file(name, ns_fd, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        digest = xxhash.xxh3_64()
        at, count = jr.SNAP.size, 0

        def put(records: list[bytes]) -> None:
            nonlocal at, count
            data = b"".join(records)
            digest.update(data)
            _write_all(fd, data, at)
            at += len(data)
            count += len(records)

        pack = jr.RECORD.pack
        entry = jr.ENTRY
        for piece in entries:
            put([pack(entry, len(i), 0, s, i) for i, s in piece])
        rest = [pack(jr.ADD, len(i), w, s, i) for i, (w, s) in pending]
        rest += [pack(jr.LASTDEL, len(i), w, 0, i) for w, i in lastdel]
        for start in range(0, len(rest), CHUNK):
            put(rest[start : start + CHUNK])
            pause()
        head = jr.pack_snapshot_head(gen, count, blocks, nbytes, digest.intdigest(),
                                     base_gen, base_offset)
        _write_all(fd, head, 0)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        layout.unlink_quiet(name, ns_fd)
        raise
    os.close(fd)


def _write_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, at = view[n:], at + n


def remove_old(ns_fd: int, gen: int, dead: Iterable[int], errors: ErrorCounts, *,
               journals_before: int | None = None) -> None:
    """Remove snapshots before `gen`, journals before `journals_before` (by default
    `gen - 1`: snapshot.<gen> may be based on journal.<gen-1>), and temporary
    snapshots of `dead` writers (or of no writer). Holds the namespace lock."""
    dead = set(dead)
    jbefore = gen - 1 if journals_before is None else journals_before
    for name in _names(ns_fd):
        g = jr.generation_of(name, "snapshot")
        stale = g is not None and g < gen
        g = jr.generation_of(name, "journal")
        stale = stale or (g is not None and g < jbefore)
        if not stale and name.startswith(".snapshot.") and name.endswith(layout.TMP_SUFFIX):
            owner = layout.parse_writer_name(name[: -len(layout.TMP_SUFFIX)].rsplit(".", 1)[-1])
            stale = owner is None or owner in dead
        if stale:
            try:
                layout.unlink_quiet(name, ns_fd)
            except OSError as exc:  # a directory planted under that name: leave it
                errors.record("cleanup", exc, name)


def snapshot_tmp_writers(ns_fd: int) -> set[int]:
    """Writers that have a temporary snapshot in the namespace directory."""
    out = set()
    for name in _names(ns_fd):
        if name.startswith(".snapshot.") and name.endswith(layout.TMP_SUFFIX):
            w = layout.parse_writer_name(name[: -len(layout.TMP_SUFFIX)].rsplit(".", 1)[-1])
            if w is not None:
                out.add(w)
    return out


def _names(ns_fd: int) -> Iterator[str]:
    yield from os.listdir(ns_fd)
