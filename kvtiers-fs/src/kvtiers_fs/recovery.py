"""What a writer that died leaves behind, and how the next lock holder settles it;
and the last resort, rebuilding a namespace's index from its block files.

A writer holds `writers/<id>` locked (flock) while alive; the kernel drops the lock
when the process dies, however it dies, so "can I take its lock?" is "is it dead?".
A dead writer can leave: intents not committed (its block file was or was not
renamed into place; its temporary file may remain), and the files of its last
frame's REMOVE records not yet unlinked (a writer unlinks its victims before it
releases the namespace lock, so only its very last frame can be unfinished).
Settling it, under the namespace lock: unlink its temporary files (their names are
derived from the intents), COMMIT the intents whose file exists and ABORT the
others, unlink its last REMOVEs unless the key is back, append GONE. After that,
usage is exactly the bytes of the complete block files on disk.

Rebuild: when no snapshot is usable or the journal is damaged (power loss without
`durable`), every block file is indexed from a scan (recency by mtime), dead
writers' temporary files are removed, and a new generation starts with RELOAD
appended to the old journal so that other processes reload.

`RecoveryMixin` is part of `RootStore` (store.py); its methods run with the
namespace lock held and use the store's state.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from typing import TYPE_CHECKING

from kvtiers_fs import journal as jr
from kvtiers_fs import layout
from kvtiers_fs.journal import Record

if TYPE_CHECKING:
    from kvtiers_fs.store import RootStore

    _Base = RootStore
else:
    _Base = object


class RecoveryMixin(_Base):
    def _writer_dead(self, writer: int) -> int | None:
        """-1 if `writer` is dead and unregistered, a descriptor holding its lock if it
        is dead (close it when done), None if it is alive."""
        if writer == self.writer:
            return None
        try:
            fd = layout.open_file(f"{writer:016x}", self._writers_fd, os.O_RDWR)
        except FileNotFoundError:
            return -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def _reconcile(self, force: bool = False) -> None:
        """Settle the leftovers of dead writers (see the module doc). Holds the lock."""
        self._last_reconcile = time.monotonic()
        with self._state:
            writers = {w for w, _ in self.pending.values()} | set(self.last_deletes)
        writers.discard(self.writer)
        for w in writers:
            fd = self._writer_dead(w)
            if fd is None:
                continue
            try:
                self._settle(w)
            except OSError as exc:
                self._errors.record("reconcile", exc)
            finally:
                if fd >= 0:
                    layout.unlink_quiet(f"{w:016x}", self._writers_fd)
                    os.close(fd)

    def _settle(self, w: int) -> None:
        with self._state:
            intents = [i for i, (pw, _) in self.pending.items() if pw == w]
            dels = [i for i in self.last_deletes.get(w, ())
                    if i not in self.policy and i not in self.pending]
        records: list[Record] = []
        for idn in intents:
            shard = self._shard_or_none(idn)
            present = False
            if shard is not None:
                try:
                    layout.unlink_quiet(layout.tmp_name(idn, w), shard)
                    st = os.stat(layout.block_name(idn), dir_fd=shard, follow_symlinks=False)
                    present = stat.S_ISREG(st.st_mode)
                except FileNotFoundError:
                    present = False
                finally:
                    os.close(shard)
            records.append(Record(jr.COMMIT if present else jr.ABORT, self.writer, 0, idn))
        self._unlink_blocks(dels)
        records.append(Record(jr.GONE, self.writer, w, b""))
        self._append(records)
        self._apply_own(records)
        self._log.info("kvtiers-fs %s: writer %016x died; settled %d intents, %d removals",
                       self.root, w, len(intents), len(dels))

    def _sweep_writers(self) -> None:
        """At start-up: unregister dead writers that left no index state (killed
        while opening), and their temporary lock files."""
        for name in os.listdir(self._writers_fd):
            if name.startswith(".") and name.endswith(layout.TMP_SUFFIX):
                w = name[1 : -len(layout.TMP_SUFFIX)]
            else:
                w = name
            try:
                writer = int(w, 16)
            except ValueError:
                continue
            with self._state:
                busy = writer in self.last_deletes or any(
                    pw == writer for pw, _ in self.pending.values())
            if busy or writer == self.writer:
                continue
            if name != w:  # a lock file never renamed into place: its writer died opening
                try:
                    st = os.stat(name, dir_fd=self._writers_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if time.time() - st.st_mtime < 60:
                    continue  # maybe a writer opening right now: leave it a minute
                fd = layout.open_file(name, self._writers_fd, os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    layout.unlink_quiet(name, self._writers_fd)
                except BlockingIOError:
                    pass
                finally:
                    os.close(fd)
                continue
            fd = self._writer_dead(writer)
            if fd is not None and fd >= 0:
                layout.unlink_quiet(name, self._writers_fd)
                os.close(fd)


    def _rebuild(self, first: bool = False) -> None:
        """Index every complete block file (recency by mtime), drop dead writers'
        temporary files, and start a new generation. Holds the lock."""
        from kvtiers_fs.scan import scan_blocks

        found = scan_blocks(self.blocks_fd, lambda w: self._writer_dead(w) is not None
                            and w != self.writer)
        _, highest = self._newest_generation()
        gen = max(highest, self.gen) + 1
        with self._state:
            own = {i: p for i, p in self.pending.items() if p[0] == self.writer}
        recs = [Record(jr.ENTRY, 0, size, idn) for _, idn, size in found if idn not in own]
        recs += [Record(jr.ADD, w, s, i) for i, (w, s) in own.items()]
        nbytes = sum(r.size for r in recs if r.op == jr.ENTRY)
        fd = layout.open_file(jr.journal_name(gen), self.ns_fd,
                              os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        os.close(fd)
        data = jr.pack_snapshot(gen, recs, len(found), nbytes)
        layout.write_small_file(jr.snapshot_name(gen), self.ns_fd, data, durable=self.durable)
        if self._jfd >= 0:
            try:  # tell readers of the old journal to reload
                self._append([Record(jr.RELOAD, self.writer, gen, b"")])
            except OSError:
                pass
        jfd = layout.open_file(jr.journal_name(gen), self.ns_fd, os.O_RDWR)
        self._install(gen, jfd, ((r.op, len(r.ident), r.writer, r.size, r.ident)
                                 for r in recs))
        self._remove_old_generations(gen)
        if not first or found:
            self._log.warning("kvtiers-fs %s: index rebuilt from %d block files", self.root,
                              len(found))
