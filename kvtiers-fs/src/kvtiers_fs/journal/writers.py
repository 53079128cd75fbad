"""`WriterRegistry`: who is alive among the processes that write a namespace.

Each writer holds `writers/<id>` (16 lower-case hex digits) locked with flock(2)
for as long as it lives; the kernel drops the lock when the process dies, however
it dies - so "can I take its lock?" is "is it dead?". A process that is stopped
(SIGSTOP) keeps its lock: it is alive, and its intents stay pending until it
resumes or dies.

Names in `writers/` that are not exactly a writer id, or that are not regular
files, are skipped (never followed, never a crash).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time

from kvtiers_fs.disk import layout

#: a lock file never renamed into place is a writer that died while opening, once
#: it is this old (seconds)
OPENING_GRACE_S = 60.0


def new_writer_id() -> int:
    while True:
        wid = int.from_bytes(os.urandom(8), "little")
        if wid:
            return wid


class WriterRegistry:
    """Thread-safe: no state but descriptors; `register` and `close` once each."""

    def __init__(self, writers_fd: int, writer: int):
        self.fd = writers_fd
        self.writer = writer
        self._me = -1

    def register(self) -> None:
        """Hold `writers/<id>` locked from now on. Locked under a temporary name
        first, so nobody ever sees it unlocked and thinks us dead."""
        name = layout.writer_name(self.writer)
        tmp = f".{name}{layout.TMP_SUFFIX}"
        fd = layout.open_file(tmp, self.fd, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        self._me = fd

    def close(self) -> None:
        """Unregister (the lock goes with the descriptor). Never raises."""
        if self._me >= 0:
            with contextlib.suppress(OSError):
                layout.unlink_quiet(layout.writer_name(self.writer), self.fd)
            layout.close_quiet(self._me)
            self._me = -1

    def dead(self, writer: int) -> int | None:
        """-1 if `writer` is dead and unregistered, a descriptor holding its lock if
        it is dead (pass it to `forget` when done), None if it is alive (or
        cannot be told: its entry is not a regular file)."""
        if writer == self.writer:
            return None
        try:
            fd = layout.open_file(layout.writer_name(writer), self.fd,
                                  os.O_RDWR | os.O_NONBLOCK)
        except FileNotFoundError:
            return -1
        except OSError:
            return None  # a directory, a link: not a writer's lock; leave it
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return None
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: alive
            os.close(fd)
            return None
        return fd

    def is_dead(self, writer: int) -> bool:
        fd = self.dead(writer)
        if fd is None:
            return False
        if fd >= 0:
            os.close(fd)
        return True

    def forget(self, writer: int, fd: int) -> None:
        """Unregister a dead writer whose state has been settled."""
        if fd >= 0:
            with contextlib.suppress(OSError):
                layout.unlink_quiet(layout.writer_name(writer), self.fd)
            os.close(fd)

    def sweep(self, busy: set[int]) -> None:
        """At start-up: unregister dead writers that left no state (`busy`: those
        that did), and the lock files of writers that died while opening."""
        for name in os.listdir(self.fd):
            if name.startswith(".") and name.endswith(layout.TMP_SUFFIX):
                writer = layout.parse_writer_name(name[1 : -len(layout.TMP_SUFFIX)])
                if writer is not None and writer != self.writer:
                    self._sweep_opening(name)
                continue
            writer = layout.parse_writer_name(name)
            if writer is None or writer in busy or writer == self.writer:
                continue
            fd = self.dead(writer)
            if fd is not None:
                self.forget(writer, fd)

    def _sweep_opening(self, name: str) -> None:
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or time.time() - st.st_mtime < OPENING_GRACE_S:
                return  # maybe a writer opening right now: leave it a minute
            fd = layout.open_file(name, self.fd, os.O_RDWR | os.O_NONBLOCK)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            layout.unlink_quiet(name, self.fd)
        except OSError:
            pass
        finally:
            os.close(fd)
