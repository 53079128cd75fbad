"""`IndexFiles`: keeps a process's `BlockIndex` equal to what its namespace's
snapshot and journal say - loading the newest snapshot and replaying the journal
from its base, catching up what other writers appended (in pieces: pacing.py),
following ROTATE, finishing a rotation whose writer died half way, and rebuilding
from the block files when the snapshot or the journal cannot be trusted; plus the
two halves of writing the next snapshot (`RootStore` holds the locks).

Its owner (`RootStore`) calls it holding its journal mutex; with `locked` /
`have_lock`, also the namespace lock (`flock`, passed in, is how it takes that
lock itself when it must). Formats: records.py; files: files.py.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from kvtiers.sdk import ErrorCounts

from kvtiers_fs.disk import layout
from kvtiers_fs.journal import files
from kvtiers_fs.journal import records as jr
from kvtiers_fs.journal.files import Journal
from kvtiers_fs.journal.index import BlockIndex
from kvtiers_fs.journal.records import Record
from kvtiers_fs.journal.recovery import rebuild_records
from kvtiers_fs.journal.writers import WriterRegistry
from kvtiers_fs.pacing import CHUNK, pause


class IndexFiles:
    def __init__(self, *, root: str, ns_fd: int, blocks_fd: int, index: BlockIndex,
                 writers: WriterRegistry, flock: Callable[[], AbstractContextManager[None]],
                 errors: ErrorCounts, logger: logging.Logger, durable: bool):
        self.root = root
        self.ns_fd = ns_fd
        self.blocks_fd = blocks_fd
        self.index = index
        self.writers = writers
        self.writer = writers.writer
        self._flock = flock
        self._errors = errors
        self._log = logger
        self.durable = durable
        self.journal = Journal(ns_fd, errors, durable)
        self.reloads = 0

    def catch_up(self, *, locked: bool) -> None:
        """Apply every complete frame after our offset, in pieces. Holding the lock,
        also cut a torn tail, finish a rotation whose writer died half way, notice a
        rebuild, and rebuild a damaged journal."""
        restarts = 0
        applied = 0
        while True:
            try:
                tail = self.journal.read()
            except jr.JournalCorrupt as exc:
                if not locked:
                    return  # the next lock holder deals with it
                self._log.error("kvtiers-fs %s: %s; rebuilding the index from the block files",
                                self.root, exc)
                self.rebuild()
                restarts += 1
                continue
            switch = None
            for records in tail.frames:
                switch = self.index.apply(records)
                if switch is not None:
                    break
                applied += len(records)
                if applied >= CHUNK:
                    applied = 0
                    pause()
            if tail.frames:
                pause()  # a piece read and applied
            if switch is not None:
                restarts += 1
                if restarts > 100:
                    raise OSError(errno.EIO, "the journal keeps changing under us")
                op, gen = switch
                if not (op == jr.ROTATE and self.journal.follow(gen)):
                    self.load(have_lock=locked)
                continue
            self.journal.offset = tail.offset
            if tail.frames and not tail.torn and tail.offset < self.journal.size():
                continue  # more to read
            if locked:
                if tail.torn:
                    self.journal.cut()  # a dead writer's torn append
                if files.exists(self.ns_fd, jr.snapshot_name(self.journal.gen + 1)):
                    restarts += 1
                    if restarts > 100:
                        raise OSError(errno.EIO, "the journal keeps changing under us")
                    self._finish_dead_rotation()
                    continue
            elif files.snapshot_base(self.ns_fd, self.journal.gen + 1) == self.journal.gen + 1:
                # A compaction (or rebuild) replaced this journal, and its RELOAD could
                # not be appended (a full disk): reload, and let the old journal go.
                self.load(have_lock=False)
            return

    def _finish_dead_rotation(self) -> None:
        """snapshot.<g+1> exists but journal.<g> has no ROTATE (lock held): its writer
        died half way. A rotation of this journal is finished (ROTATE appended);
        anything else (a rebuild's snapshot) is reloaded."""
        new = self.journal.gen + 1
        try:
            head = files.read_snapshot(self.ns_fd, new)
        except (OSError, ValueError):
            head = None
        if head is not None and head.base_gen == self.journal.gen \
                and head.base_offset <= self.journal.offset:
            if not files.exists(self.ns_fd, jr.journal_name(new)):
                files.create_journal(self.ns_fd, new)
            self.journal.append([Record(jr.ROTATE, self.writer, new, b"")])
            if self.journal.follow(new):
                return
        self.load(have_lock=True)

    def load(self, *, have_lock: bool) -> None:
        """Replace the in-memory index by the newest snapshot plus its journal."""
        self.reloads += 1
        for _ in range(20):
            gen, _highest = files.generations(self.ns_fd)
            if gen is None:
                with self._maybe_flock(have_lock):
                    if files.generations(self.ns_fd)[0] is None:
                        self.rebuild(first=True)
                        return
                continue
            try:
                snap = files.read_snapshot(self.ns_fd, gen)
                jfd = layout.open_file(jr.journal_name(snap.base_gen), self.ns_fd, os.O_RDWR)
            except FileNotFoundError:
                with self._maybe_flock(have_lock):
                    if files.generations(self.ns_fd)[0] == gen:
                        self.rebuild()  # a generation without its journal
                        return
                continue
            except (ValueError, OSError) as exc:
                self._log.error("kvtiers-fs %s: %s is unusable (%s); rebuilding the index "
                                "from the block files", self.root, jr.snapshot_name(gen), exc)
                with self._maybe_flock(have_lock):
                    if files.generations(self.ns_fd)[0] == gen:
                        self.rebuild()
                        return
                continue
            if snap.base_offset > os.fstat(jfd).st_size:
                os.close(jfd)
                self._log.error("kvtiers-fs %s: %s is shorter than its snapshot says; "
                                "rebuilding the index", self.root, jr.journal_name(snap.base_gen))
                with self._maybe_flock(have_lock):
                    self.rebuild()
                return
            self.index.install(jr.raw_records(snap.body), report=self.reloads > 1)
            self.journal.switch(jfd, snap.base_gen, snap.base_offset)
            self.catch_up(locked=have_lock)
            return
        raise OSError(errno.EIO, f"cannot load the index of {self.root}")

    @contextmanager
    def _maybe_flock(self, have_lock: bool) -> Iterator[None]:
        if have_lock:
            yield
        else:
            with self._flock():
                yield

    def rebuild(self, first: bool = False) -> None:
        """Index every complete block file, drop dead writers' temporary files, and
        start a new generation (lock held)."""
        own = {i: p for i, p in self.index.pending.items() if p[0] == self.writer}
        recs, blocks, nbytes = rebuild_records(self.blocks_fd, self.writers, own)
        _, highest = files.generations(self.ns_fd)
        gen = max(highest, self.journal.gen) + 1
        files.create_journal(self.ns_fd, gen)
        tmp = files.snapshot_tmp_name(gen, self.writer)
        layout.unlink_quiet(tmp, self.ns_fd)
        data = jr.pack_snapshot(gen, recs, blocks, nbytes)
        layout.write_small_file(jr.snapshot_name(gen), self.ns_fd, data, durable=self.durable)
        if self.journal.fd >= 0:
            with contextlib.suppress(OSError):  # tell readers of the old journal to reload
                self.journal.append([Record(jr.RELOAD, self.writer, gen, b"")])
        jfd = layout.open_file(jr.journal_name(gen), self.ns_fd, os.O_RDWR)
        self.index.install(((r.op, len(r.ident), r.writer, r.size, r.ident) for r in recs),
                           report=not first)
        self.journal.switch(jfd, gen, 0)
        self.remove_old(gen)
        if not first or blocks:
            self._log.warning("kvtiers-fs %s: index rebuilt from %d block files", self.root,
                              blocks)

    def remove_old(self, gen: int, *, based_on_own: bool = False) -> None:
        """Remove what snapshot.<gen> makes stale; `based_on_own`: it is based on
        the start of journal.<gen> (a compaction), so journal.<gen-1> goes too."""
        dead = [w for w in files.snapshot_tmp_writers(self.ns_fd) if self.writers.is_dead(w)]
        files.remove_old(self.ns_fd, gen, dead, self._errors,
                         journals_before=gen if based_on_own else gen - 1)

    def compact(self, evict: Callable[[int], int]) -> int:
        """A new generation from the index in memory (lock held, caught up, the index
        equal to the journal): snapshot.<n> based on the start of an empty
        journal.<n>, then every older journal and snapshot removed - so the
        metadata shrinks to one snapshot. Readers of the old journal find RELOAD
        there or, where it could not be appended (the disk is full), notice
        snapshot.<n> (`catch_up`) and reload.

        When the filesystem has no room for the snapshot: stale files (dead
        writers' temporaries, old generations) are removed first, then the journal
        the newest snapshot is based on (a crash before the new snapshot is in
        place then costs a rebuild from the block files, never a wrong block),
        then `evict(bytes)` removes blocks (least valuable first; returns the
        bytes freed, 0 when nothing can go). Returns the new generation; raises
        OSError if no room can be made."""
        _, highest = files.generations(self.ns_fd)
        gen = max(highest, self.journal.gen) + 1
        tmp = files.snapshot_tmp_name(gen, self.writer)
        layout.unlink_quiet(tmp, self.ns_fd)
        steps = 0
        while True:
            try:
                files.create_journal(self.ns_fd, gen)  # empty: an inode, no data
                self._write_snapshot(tmp, gen, gen, 0)
                break
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    layout.unlink_quiet(jr.journal_name(gen), self.ns_fd)
                    raise
                steps += 1
                self._log.warning("kvtiers-fs %s: no room for a snapshot (%s); freeing "
                                  "space (step %d)", self.root, exc, steps)
                if steps == 1:
                    self.remove_old(self.journal.gen)
                elif steps == 2:
                    files.remove_old(self.ns_fd, 0, (), self._errors,
                                     journals_before=self.journal.gen)
                elif steps > 64 or not evict(self._snapshot_bytes()):
                    layout.unlink_quiet(jr.journal_name(gen), self.ns_fd)
                    raise
        try:
            os.rename(tmp, jr.snapshot_name(gen), src_dir_fd=self.ns_fd, dst_dir_fd=self.ns_fd)
        except OSError:
            layout.unlink_quiet(tmp, self.ns_fd)
            layout.unlink_quiet(jr.journal_name(gen), self.ns_fd)
            raise
        if self.durable:
            os.fsync(self.ns_fd)
        with contextlib.suppress(OSError):  # tell readers of the old journal to reload
            self.journal.append([Record(jr.RELOAD, self.writer, gen, b"")])
        jfd = layout.open_file(jr.journal_name(gen), self.ns_fd, os.O_RDWR)
        self.journal.switch(jfd, gen, 0)
        self.remove_old(gen, based_on_own=True)
        return gen

    def write_next_snapshot(self) -> tuple[str, int, int]:
        """Write snapshot.<g+1> of the index as of the current offset X of
        journal.<g>, under a temporary name (holding the journal mutex, not the
        namespace lock). Returns (temporary name, g, X)."""
        jgen, offset = self.journal.gen, self.journal.offset
        tmp = files.snapshot_tmp_name(jgen + 1, self.writer)
        layout.unlink_quiet(tmp, self.ns_fd)
        self._write_snapshot(tmp, jgen + 1, jgen, offset)
        return tmp, jgen, offset

    def _snapshot_bytes(self) -> int:
        index = self.index
        records = index.blocks + index.reserved + len(index.last_delete_items())
        return jr.SNAP.size + jr.RECORD.size * records

    def _write_snapshot(self, tmp: str, gen: int, base_gen: int, base_offset: int) -> None:
        index = self.index
        pending, lastdel = index.pending_items(), index.last_delete_items()
        blocks, nbytes = index.blocks, index.committed_bytes()
        with contextlib.closing(index.entries()) as entries:  # it holds the index's lock
            files.write_snapshot(self.ns_fd, tmp, gen, entries, pending, lastdel,
                                 blocks=blocks, nbytes=nbytes, base_gen=base_gen,
                                 base_offset=base_offset, durable=self.durable)

    def install_next_snapshot(self, tmp: str, jgen: int) -> bool:
        """Holding the lock, caught up: rename `tmp` into place as snapshot.<g+1>,
        create journal.<g+1>, append ROTATE and follow it. False (and `tmp` removed)
        if someone else rotated or rebuilt meanwhile."""
        new = jgen + 1
        if self.journal.gen != jgen or files.exists(self.ns_fd, jr.snapshot_name(new)):
            layout.unlink_quiet(tmp, self.ns_fd)
            return False
        try:
            files.create_journal(self.ns_fd, new)
            os.rename(tmp, jr.snapshot_name(new), src_dir_fd=self.ns_fd, dst_dir_fd=self.ns_fd)
        except OSError:
            layout.unlink_quiet(tmp, self.ns_fd)
            raise
        if self.durable:
            os.fsync(self.ns_fd)
        # If this append fails, the next lock holder finds snapshot.<g+1> without a
        # ROTATE and appends it (`_finish_dead_rotation`).
        self.journal.append([Record(jr.ROTATE, self.writer, new, b"")])
        self.journal.follow(new)
        self.remove_old(new)
        return True
