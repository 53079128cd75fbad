"""`Settlement`: what a writer that died leaves behind, and how the next lock holder
settles it; and `rebuild_records`, the last resort that indexes a namespace from
its block files.

A dead writer (see writers.py) can leave: intents not committed (its block file was
or was not renamed into place; its temporary file may remain), and the files of its
last frame's REMOVE records not yet unlinked (a writer unlinks its victims before it
releases the namespace lock, so only its very last frame can be unfinished).
Settling it, under the namespace lock: remove its temporary files (their names
derive from the intents), COMMIT each intent whose file is in place and verifies
(header, key, size, checksum: a store waiting for that block reports success on
this COMMIT, so it must be a complete copy) and ABORT the others - both written
with the dead writer's id, since a COMMIT or ABORT ends only its own writer's
intent - unlink its last REMOVEs unless the key is back, append GONE. After that,
usage is exactly the bytes of the complete block files on disk.

Nothing here raises for what it finds on disk: an unreachable shard (a planted
symlink) makes an intent ABORT, never an exception half way (which would leave the
intents pending for ever).

Rebuild: when no snapshot is usable or the journal is damaged (power loss without
`durable`), every block file is indexed from a scan (recency by mtime) and dead
writers' temporary files are removed; the store starts a new generation from it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from kvtiers.sdk import ErrorCounts

from kvtiers_fs.disk.blockdir import BlockDir
from kvtiers_fs.disk.layout import Ident
from kvtiers_fs.disk.scan import scan_blocks
from kvtiers_fs.journal import records as jr
from kvtiers_fs.journal.index import BlockIndex
from kvtiers_fs.journal.records import Record
from kvtiers_fs.journal.writers import WriterRegistry

#: real seconds between looks for dead writers that left state behind
RECONCILE_EVERY_S = 2.0


class Settlement:
    """Settles dead writers' leftovers into `index` through `commit_frame` (which
    appends a frame to the journal and applies it to the index). Every method runs
    with the namespace lock held (the store's `_locked`)."""

    def __init__(self, index: BlockIndex, blocks: BlockDir, writers: WriterRegistry,
                 commit_frame: Callable[[list[Record]], None], errors: ErrorCounts,
                 logger: logging.Logger, where: str):
        self._index = index
        self._blocks = blocks
        self._writers = writers
        self._commit_frame = commit_frame
        self._errors = errors
        self._log = logger
        self._where = where
        self._last = 0.0
        self.settled = 0  # dead writers settled by this process

    def due(self) -> bool:
        return time.monotonic() - self._last > RECONCILE_EVERY_S

    def reconcile(self) -> None:
        """Settle every dead writer that has state in the index."""
        self._last = time.monotonic()
        writers = self._index.writers_with_state()
        writers.discard(self._writers.writer)
        for w in writers:
            self.settle_writer(w)

    def settle_writer(self, w: int) -> bool:
        """Settle `w` if it is dead (True then)."""
        fd = self._writers.dead(w)
        if fd is None:
            return False
        try:
            self._settle(w)
        except OSError as exc:  # the journal refused the frame: try again later
            self._errors.record("reconcile", exc)
            if fd >= 0:
                os.close(fd)
            return False
        self._writers.forget(w, fd)
        return True

    def _settle(self, w: int) -> None:
        index = self._index
        intents = [(i, index.pending[i][1]) for i in index.intents_of(w)]
        dels = [i for i in index.last_deletes.get(w, ())
                if not index.contains(i) and i not in index.pending]
        records = [Record(jr.COMMIT if self._blocks.settle_file(idn, w, size) else jr.ABORT,
                          w, size, idn) for idn, size in intents]
        self._blocks.unlink_blocks(dels)
        records.append(Record(jr.GONE, self._writers.writer, w, b""))
        self._commit_frame(records)
        self.settled += 1
        committed = sum(r.op == jr.COMMIT for r in records)
        self._log.info("kvtiers-fs %s: writer %016x died; settled %d intents (%d complete), "
                       "%d removals", self._where, w, len(intents), committed, len(dels))


def rebuild_records(blocks_fd: int, writers: WriterRegistry,
                    own: dict[Ident, tuple[int, int]]) -> tuple[list[Record], int, int]:
    """A new index from the block files: (snapshot records, blocks, bytes) - every
    complete-looking block file oldest first (they are verified when loaded), plus
    this writer's own intents in flight (`own`). Dead writers' temporary files are
    removed on the way."""
    me = writers.writer
    found = scan_blocks(blocks_fd, lambda w: w != me and writers.is_dead(w))
    recs = [Record(jr.ENTRY, 0, size, idn) for _, idn, size in found if idn not in own]
    nbytes = sum(r.size for r in recs)
    blocks = len(recs)
    recs += [Record(jr.ADD, w, s, i) for i, (w, s) in own.items()]
    return recs, blocks, nbytes
