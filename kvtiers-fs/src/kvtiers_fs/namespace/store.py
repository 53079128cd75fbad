"""`RootStore`: one namespace on one root directory - its index, its capacity bound,
and the journal that several processes share.

Capacity accounting across processes
------------------------------------
Every process that opens the namespace keeps the whole index in memory
(`BlockIndex`: committed blocks with their file sizes - in the core's
`kvtiers.sdk.BoundedIndex`, which owns the policy, the pin counts and the capacity
bound - plus pending intents) and
keeps it current by reading one shared, append-only journal (`journal.records`). Usage is
a fold of that journal: committed bytes plus bytes of pending intents, whoever
wrote them. Changes are appended under an exclusive flock(2) of `<ns>/lock`, and a
writer always reads the journal to its end before it decides anything, so every
decision sees every other writer's reservations:

1. reserve (one critical section per store job): for each key neither committed
   nor pending anywhere, evict victims by policy until it fits (unpinned in this
   process; `BoundedIndex.hold`), append `[REMOVE..., ADD...]` as one frame, rename
   each victim's file to the temporary name of the block it made room for (`BlockDir.recycle`) or
   unlink it, release the lock. A key committed already is `PRESENT`; a key
   pending in another intent is `PENDING`: the job waits for that intent to end
   (`await_intent`, waits.py) - it is never reported stored before a complete copy
   is committed, by whichever writer;
2. write the block files (no lock: into the recycled file or a new one under the
   temporary name, then rename);
3. commit (one critical section): append `[COMMIT or ABORT per key]`.

So usage never exceeds `capacity_bytes`: a writer's blocks in flight are already
counted as its pending intents. Two writers never write one file: a key has at
most one intent at a time.

Crashes: a writer that dies (kill -9, at any instant) leaves at most its
uncommitted intents and its last frame's unlinks; the next lock holder settles
them (`journal.recovery.Settlement`). After that, usage is exactly the bytes of the
complete block files on disk.

Restart. `snapshot.<g>` holds the index (blocks least recently used first, so
recency survives) as of an offset in a journal; start-up reads the newest snapshot
and replays the journal from there - no scan of the block files. When the journal
grows past max(16 MiB, twice the snapshot) - at most half its limit - this process
writes the next snapshot in the background (`_rotate`: one process at a time, in
pieces, holding only its own journal mutex, not the namespace lock), then, under the
lock, renames it into place and appends ROTATE; readers follow the ROTATE without
reloading.

Room on disk (`kvtiers_fs.overhead`): a lock holder that finds the journal at its
limit (`overhead.journal_limit`: the background rotation fell behind or failed), or
whose append fails for a full filesystem, compacts (`_compact`): a snapshot of its
index based on the start of a new, empty journal, older files removed - blocks
evicted first only when nothing else frees room for that snapshot. So journals,
snapshots and temporaries stay within a stated room beside `capacity_bytes`, and a
filesystem full of the namespace's own metadata does not fail stores for ever.

If the journal or the snapshot is damaged (power loss without `durable`), the lock
holder rebuilds the index from a scan of the block files.

Parts, each with its own state and test: `BlockIndex` (the in-memory index),
`IndexFiles` (snapshot and journal: load, catch up, rebuild, next snapshot),
`BlockDir` (operations on block files), `WriterRegistry` (who is alive),
`Settlement` (what dead writers left), `IntentWaits` (stores waiting for another
writer). The store owns the locks and the protocol above.

Threads: `contains`, `pin` (and releasing its `Pins`), `touch` and `stats` are for
any thread, the scheduler's included: lock-free, O(1) per key (`BlockIndex`). Everything that reads
or appends the journal runs on I/O, probe, wait or rotation threads under `_mu`
(and the flock for appends); work proportional to the number of blocks (loading,
catching up, snapshotting) is done in pieces that give the GIL away (pacing.py).
Removed blocks (evicted, dropped as damaged, removed by another process) are
reported to `on_removed` as keys, from whichever of those threads saw them go.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from kvtiers.sdk import Clock, ErrorCounts, EvictionPolicy, Namespace, NamespaceInventory, Pins

from kvtiers_fs import overhead
from kvtiers_fs.disk import layout
from kvtiers_fs.disk.blockdir import BlockDir
from kvtiers_fs.disk.layout import Ident
from kvtiers_fs.journal import records as jr
from kvtiers_fs.journal.files import Journal
from kvtiers_fs.journal.index import BlockIndex
from kvtiers_fs.journal.indexfiles import IndexFiles
from kvtiers_fs.journal.records import Record
from kvtiers_fs.journal.recovery import Settlement
from kvtiers_fs.journal.writers import WriterRegistry, new_writer_id
from kvtiers_fs.namespace.listing import write_namespace_file
from kvtiers_fs.namespace.waits import ABSENT, COMMITTED, PENDING, IntentWaits
from kvtiers_fs.namespace.write_verdict import WriteVerdict
from kvtiers_fs.pacing import CHUNK

#: rotate the journal once it is larger than this and ROTATE_FACTOR times the snapshot
ROTATE_MIN_BYTES = 16 << 20
ROTATE_FACTOR = 2
#: ... and at a clean close once it is larger than this (and twice the snapshot)
CLOSE_ROTATE_BYTES = 1 << 20
#: errors of a load that say nothing about the block (the process is short of
#: something): the block stays indexed
_TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN,
                        errno.EINTR, errno.ENOBUFS})
#: a full filesystem (or quota): compact the journal, then try again
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: real seconds before a compaction of a journal past its limit is tried again after
#: one failed
COMPACT_RETRY_S = 1.0

__all__ = ["RootStore"]


class RootStore:
    """One namespace's blocks on one root. Construct, then `open()` (blocking I/O:
    call it from the tier's constructor, not the scheduler loop)."""

    def __init__(
        self,
        root: str,
        namespace: Namespace,
        *,
        capacity_bytes: int,
        policy_factory: Callable[[], EvictionPolicy],
        durable: bool = False,
        errors: ErrorCounts,
        logger: logging.Logger,
        on_removed: Callable[[list[bytes]], None] | None = None,
    ):
        self.root = root
        self.namespace = namespace
        self.fingerprint = namespace.fingerprint
        self.capacity_bytes = capacity_bytes
        #: the lock holder compacts the journal at this size (`overhead`)
        self.journal_limit = overhead.journal_limit(capacity_bytes)
        self.durable = durable
        self.writer = new_writer_id()
        self._errors = errors
        self._log = logger
        self._on_removed = on_removed
        self._mu = threading.RLock()  # the journal position and the index, in this process
        self.index = BlockIndex(policy_factory(), capacity_bytes)
        self._outbox: list[Record] = []  # records that could not be appended yet
        self._last_touch_flush = time.monotonic()
        self._rotation: threading.Thread | None = None
        self._waits = IntentWaits(self, lambda op, exc: self._errors.record(op, exc))
        self.ns_fd = self.blocks_fd = self._writers_fd = self._lock_fd = -1
        self.evictions = 0
        self.recycled = 0  # evicted files reused as new blocks' files
        self.rotations = 0
        self.compactions = 0  # new generations written under the lock (journal limit, full disk)
        self._compact_failed = -COMPACT_RETRY_S  # monotonic time of the last failure
        self.waited = 0  # stores that waited for another intent on their block
        self._opened = False
        self.closed = False

    # -- opening and closing ----------------------------------------------------

    def open(self) -> None:
        """Create or open the namespace directory, register this writer, load the
        index and settle writers that died. Raises OSError."""
        root_fd = layout.open_root(self.root)
        try:
            self.ns_fd = layout.open_dir(self.fingerprint, root_fd, create=True)
        finally:
            os.close(root_fd)
        write_namespace_file(self.ns_fd, self.namespace, durable=self.durable,
                             logger=self._log, where=self.root)
        self.blocks_fd = layout.open_dir("blocks", self.ns_fd, create=True)
        self._writers_fd = layout.open_dir("writers", self.ns_fd, create=True)
        self._lock_fd = layout.open_file("lock", self.ns_fd, os.O_RDWR | os.O_CREAT)
        self.blocks = BlockDir(self.blocks_fd, self.fingerprint, self._errors)
        self.writers = WriterRegistry(self._writers_fd, self.writer)
        self.writers.register()
        self.files = IndexFiles(root=self.root, ns_fd=self.ns_fd, blocks_fd=self.blocks_fd,
                                index=self.index, writers=self.writers, flock=self._flock,
                                errors=self._errors, logger=self._log, durable=self.durable)
        self._journal = self.files.journal
        self._settlement = Settlement(self.index, self.blocks, self.writers, self._commit_frame,
                                      self._errors, self._log, self.root)
        with self._mu:
            self.files.load(have_lock=False)
            with self._locked():
                self.writers.sweep(self.index.writers_with_state())
                self._settlement.reconcile()
        self._opened = True

    def close(self) -> None:
        """End waits (`CLOSED`), finish a snapshot being written, flush touches,
        unregister, close descriptors. Idempotent; never raises."""
        if self.closed:
            return
        self._waits.close()
        self.closed = True  # no rotation starts from now on
        with self._mu:
            rotation = self._rotation
        if rotation is not None:
            rotation.join()
        if self._opened:
            try:
                # Touches go to the journal; a journal grown past a few MiB becomes a
                # snapshot, so the next start-up (and `list_namespaces`) reads less.
                with self._locked(rotate=False):
                    pass
                self._rotate(CLOSE_ROTATE_BYTES)
            except Exception as exc:  # noqa: BLE001 - closing must not raise
                self._errors.record("close", exc)
        writers: WriterRegistry | None = getattr(self, "writers", None)
        if writers is not None:
            writers.close()
        journal: Journal | None = getattr(self, "_journal", None)
        if journal is not None:
            journal.close()
        for fd in (self._lock_fd, self._writers_fd, self.blocks_fd, self.ns_fd):
            if fd >= 0:
                layout.close_quiet(fd)
        self._lock_fd = self._writers_fd = self.blocks_fd = self.ns_fd = -1

    # -- any thread: memory only, O(1) per key ------------------------------------

    def contains(self, idn: Ident) -> bool:
        return self.index.contains(idn)

    def pin(self, idns: list[Ident]) -> Pins[int]:
        """Keep the blocks held now from eviction until the result is released."""
        return self.index.pin(idns)

    def touch(self, idns: Iterable[Ident]) -> None:
        """Refresh recency (applied at the next drain; the journal learns it at the
        next flush). A long queue is applied here if the journal mutex is free
        (amortised O(1) per key; never waits)."""
        self.index.touch(idns)
        if self.index.queued() > CHUNK:
            self._drain_if_free()

    def stats(self) -> tuple[int, int, int]:
        """(usage bytes, committed blocks, pending intents)."""
        index = self.index
        return index.usage, index.blocks, index.reserved

    # -- I/O-thread side --------------------------------------------------------

    def sync(self) -> None:
        """Read what other writers appended (no lock needed to read)."""
        with self._mu:
            self.files.catch_up(locked=False)
            self.index.drain()
            self._report_removed()

    def intent_state(self, idn: Ident) -> tuple[str, int]:
        """(COMMITTED, 0), (PENDING, its writer) or (ABSENT, 0), as far as read."""
        index = self.index
        if index.contains(idn):
            return COMMITTED, 0
        p = index.pending.get(idn)
        return (PENDING, p[0]) if p is not None else (ABSENT, 0)

    def settle_if_dead(self, writer: int) -> None:
        """Settle `writer`'s leftovers now if it died (takes the lock only then)."""
        if self.writers.is_dead(writer):
            with self._locked():
                self._settlement.settle_writer(writer)

    def await_intent(self, idn: Ident, size: int, deadline: float | None, clock: Clock,
                     done: Callable[[WriteVerdict], None]) -> None:
        """For a `PENDING` verdict: call `done` once the other intent on `idn` has
        ended - `PRESENT` (committed), `GRANTED`/`RECYCLED` (reserved for the
        caller now: write, then commit or abort as usual), `FULL`, `TIMEOUT`
        (`deadline` on `clock` passed), `CLOSED` or `ERROR`. Never blocks."""
        self.waited += 1
        self._waits.add(idn, size, deadline, clock, done)

    def reserve(self, items: list[tuple[Ident, int]]) -> tuple[list[WriteVerdict], int]:
        """Reserve room for blocks (ident, file bytes); see the module doc. Returns a
        verdict per item and the number of blocks evicted to make room. Raises
        OSError when the journal cannot be appended (nothing reserved then)."""
        with self._locked():
            index = self.index
            # Blocks of this job that are already here are reported stored: refresh
            # them, and never evict them to make room for the job's other blocks.
            present = [idn for idn, _ in items if index.contains(idn)]
            if present:
                index.touch(present)
            with index.pin(present):
                try:
                    return self._reserve_locked(items)
                except OSError as exc:  # nothing reserved: the index equals the journal
                    if exc.errno not in _FULL or not self._compact():
                        raise
                return self._reserve_locked(items)

    def _reserve_locked(self, items: list[tuple[Ident, int]]) -> tuple[list[WriteVerdict], int]:
        """`reserve` under the namespace lock, with the job's present blocks pinned."""
        index = self.index
        verdicts: list[WriteVerdict] = []
        victims: list[tuple[Ident, int]] = []
        adds: list[tuple[Ident, int]] = []
        reuse: dict[Ident, tuple[Ident, int]] = {}  # granted -> a victim, its size
        seen: set[Ident] = set()
        extra, full = 0, False
        for idn, size in items:
            if index.contains(idn):
                verdicts.append(WriteVerdict.PRESENT)
                continue
            if idn in index.pending or idn in seen:
                verdicts.append(WriteVerdict.PENDING)
                continue
            got = None if full else index.make_room(size)  # counted now, if it fits
            if got is None:
                full = True  # a prefix: the job's later blocks would not fit either
                verdicts.append(WriteVerdict.FULL)
                continue
            if got and got[0][1] == size:
                reuse[idn] = got[0]
            victims += got
            extra += size
            adds.append((idn, size))
            seen.add(idn)
            verdicts.append(WriteVerdict.GRANTED)
        if not adds and not victims:
            return verdicts, 0
        records = [Record(jr.REMOVE, self.writer, s, i) for i, s in victims]
        records += [Record(jr.ADD, self.writer, s, i) for i, s in adds]
        try:
            self._journal.append(records)
        except OSError:
            index.put_back(victims, extra)  # back in, as the newest: nothing happened
            raise
        # The frame is in the journal: from here on nothing may raise before the
        # index says what it says (BlockDir never raises).
        index.add_own(self.writer, adds)
        index.set_last_deletes(self.writer, [i for i, _ in victims])
        self._report_removed()  # before the files go: a long key is read from one
        recycled = {idn for idn, (v, size) in reuse.items()
                    if self.blocks.recycle(v, idn, size, self.writer)}
        taken = {reuse[idn][0] for idn in recycled}
        self.blocks.unlink_blocks([i for i, _ in victims if i not in taken])
        verdicts = [WriteVerdict.RECYCLED if v is WriteVerdict.GRANTED and idn in recycled else v
                    for (idn, _), v in zip(items, verdicts, strict=True)]
        self.evictions += len(victims)
        self.recycled += len(taken)
        return verdicts, len(victims)

    def commit(self, done: list[Ident], failed: list[Ident]) -> None:
        """End this writer's reserved intents: `done` blocks are in place, `failed`
        are not (their temporary files are removed). If the journal cannot take the
        commits, the written files are removed and everything is aborted later;
        raises OSError."""
        if not done and not failed:
            return
        self.blocks.unlink_tmps(failed, self.writer)  # a recycled file never written
        try:
            with self._locked():
                own = self.index.pending
                records = [Record(jr.COMMIT, self.writer, own.get(i, (0, 0))[1], i)
                           for i in done]
                records += [Record(jr.ABORT, self.writer, 0, i) for i in failed]
                self._commit_frame(records)
        except OSError:
            self.blocks.unlink_blocks(done)
            with self._mu:
                self._outbox.extend(Record(jr.ABORT, self.writer, 0, i) for i in done + failed)
            raise
        finally:
            self._waits.wake()

    def remove(self, idn: Ident, *, delete_file: bool) -> bool:
        """Drop a committed block from the index (REMOVE and unlink it when
        `delete_file`, else FORGET: a file that is not ours to delete). False if
        it was not in the index."""
        with self._locked():
            size = self.index.size_of(idn)
            if size is None:
                return False
            self._commit_frame([Record(jr.REMOVE if delete_file else jr.FORGET,
                                       self.writer, size, idn)])
            self._report_removed()
            if delete_file:
                self.blocks.unlink_blocks([idn])
            return True

    def forget_unless_present(self, idn: Ident) -> bool:
        """A load of `idn` found no copy of its own at its name (the file gone, or
        another namespace's or layout's): drop it from the index and leave the name
        alone (FORGET) - unless, under the lock, a valid copy is there after all.
        That happens when another process evicted the block and stored it again
        between the failed read and now: forgetting that new, committed copy would
        leave its file on disk uncounted (the bound overshot by one block, until
        the key is stored again). False if it was kept (or not indexed)."""
        with self._locked():
            size = self.index.size_of(idn)
            if size is None or self.blocks.holds_copy(idn, size):
                return False
            self._commit_frame([Record(jr.FORGET, self.writer, size, idn)])
            self._report_removed()
            return True

    def unreadable(self, idn: Ident, exc: OSError) -> None:
        """A load of `idn` failed with `exc`: unless the error is the process's (out
        of descriptors or memory), the block cannot be served - drop it (and its
        file, where that can be removed), so it is not a HIT for ever."""
        if exc.errno in _TRANSIENT:
            return
        try:
            self.remove(idn, delete_file=True)
        except OSError as err:
            self._errors.record("remove", err, self.root)

    def flush_touches(self, force: bool = False) -> None:
        """Append buffered touches (at most once a second unless `force`). Never
        waits for a long catch-up or a snapshot in progress (then: later)."""
        if not force and time.monotonic() - self._last_touch_flush < 1.0:
            return
        if not self._mu.acquire(blocking=False):
            return
        try:
            with self._locked():
                pass  # `_locked` appends the touches
        finally:
            self._mu.release()

    def shard_fd(self, idn: Ident, create: bool) -> int:
        """A descriptor of the shard directory of `idn` (the caller closes it)."""
        return self.blocks.shard(idn, create=create)

    def inventory(self, *, ages: bool = False) -> NamespaceInventory:
        """What this namespace holds on this root (see `kvtiers.contract.inventory`), after
        reading what other writers appended. Blocks; time proportional to the blocks
        (plus a stat per block with `ages`); never the scheduler thread's."""
        self.sync()
        with self._mu:
            with contextlib.closing(self.index.entries()) as pieces:
                entries = [e for piece in pieces for e in piece]
            pending = self.index.pending_items()
        records, unnamed = self.blocks.records(entries, ages=ages)
        return NamespaceInventory(
            self.fingerprint, self.root, tuple(records),
            committed_bytes=sum(s for _, s in entries),
            reserved_bytes=sum(s for _, (_, s) in pending), reserved_blocks=len(pending),
            capacity_bytes=self.capacity_bytes, unnamed_blocks=unnamed,
            eviction_order=True)  # `entries` come in the index's order of use

    # -- the journal --------------------------------------------------------------

    @contextmanager
    def _flock(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextmanager
    def _locked(self, rotate: bool = True) -> Iterator[None]:
        """The namespace lock, with the index caught up to the end of the journal,
        queued operations applied, leftovers of dead writers settled now and then,
        queued records and buffered touches appended first."""
        with self._mu:
            with self._flock():
                self.files.catch_up(locked=True)
                self.index.drain()
                if self._journal.offset >= self.journal_limit and \
                        time.monotonic() - self._compact_failed > COMPACT_RETRY_S:
                    self._compact()  # the background rotation fell behind, or failed
                if self._outbox:
                    out, self._outbox = self._outbox, []
                    try:
                        self._commit_frame(out)
                    except OSError:
                        self._outbox = out + self._outbox
                if self._settlement.due():
                    self._settlement.reconcile()
                self._flush_touches_locked()
                yield
                self._report_removed()
            if rotate:
                self._maybe_rotate()

    def _commit_frame(self, records: list[Record]) -> None:
        """Append one frame and fold it into the index (lock held, the index equal to
        the journal). A full filesystem: compact, then append again."""
        try:
            self._journal.append(records)
        except OSError as exc:
            if exc.errno not in _FULL or not self._compact():
                raise
            self._journal.append(records)
        self.index.apply(records)

    def _compact(self) -> bool:
        """Replace the journal by a new generation now, under the lock (the index
        equal to the journal): what keeps the metadata within `overhead`, and what
        gets a namespace whose filesystem is full of its own journal going again
        (`IndexFiles.compact`; blocks are evicted only when nothing else frees
        room for the snapshot). False (recorded) if it failed."""
        try:
            self.files.compact(self._evict_for_room)
        except OSError as exc:
            self._errors.record("compact", exc, self.root)
            self._compact_failed = time.monotonic()
            return False
        self.compactions += 1
        self._report_removed()
        return True

    def _evict_for_room(self, nbytes: int) -> int:
        """Evict unpinned blocks by policy, at least `nbytes` of them if there are,
        and remove their files - without a journal frame (there is no room for
        one): the compaction's snapshot leaves them out. Bytes evicted."""
        bounded = self.index.bounded
        used = bounded.committed_bytes + bounded.reserved_bytes
        want = min(nbytes, bounded.committed_bytes)
        if want <= 0:
            return 0
        victims = bounded.hold(max(0, bounded.capacity_bytes - used) + want)
        if victims is None:
            return 0
        bounded.release(max(0, bounded.capacity_bytes - used) + want)
        self.blocks.unlink_blocks([idn for idn, _ in victims])
        self.evictions += len(victims)
        freed = sum(size for _, size in victims)
        self._log.warning("kvtiers-fs %s: evicted %d blocks to make room for the index",
                          self.root, len(victims))
        return freed

    def _flush_touches_locked(self) -> None:
        idns = self.index.take_touched()
        self._last_touch_flush = time.monotonic()
        if idns:
            # recency is best effort; the in-memory order already has them
            with contextlib.suppress(OSError):
                self._journal.append([Record(jr.TOUCH, self.writer, 0, i) for i in idns])

    def _drain_if_free(self) -> None:
        if self._mu.acquire(blocking=False):
            try:
                self.index.drain()
            finally:
                self._mu.release()

    def _report_removed(self) -> None:
        idns = self.index.take_removed()
        if not idns or self._on_removed is None:
            return
        keys = self.blocks.keys(idns)
        try:
            self._on_removed(keys)
        except Exception as exc:  # noqa: BLE001 - a listener's bug is not the store's
            self._errors.record("events", exc)

    # -- rotation -------------------------------------------------------------------

    def _threshold(self, min_bytes: int) -> int:
        return max(min_bytes, ROTATE_FACTOR * jr.RECORD.size * self.index.blocks)

    def _background_threshold(self) -> int:
        """Rotate in the background past this: never later than half the journal
        limit, so that a rotation normally ends before the lock holder has to
        compact."""
        return min(self._threshold(ROTATE_MIN_BYTES), self.journal_limit // 2)

    def _maybe_rotate(self) -> None:
        """Start writing the next snapshot in the background when the journal has
        grown enough (called after the lock is released)."""
        if self.closed or self._journal.offset < self._background_threshold():
            return
        with self._mu:
            if self._rotation is not None and self._rotation.is_alive():
                return
            self._rotation = threading.Thread(target=self._rotate_quietly, daemon=True,
                                              name="kvtiers-fs-rotate")
            self._rotation.start()

    def _rotate_quietly(self) -> None:
        try:
            self._rotate(ROTATE_MIN_BYTES, background=True)
        except Exception as exc:  # noqa: BLE001 - a failed rotation is retried later
            self._errors.record("rotate", exc)

    def _rotate(self, min_bytes: int, background: bool = False) -> bool:
        """Write snapshot.<g+1> of the index as of the current offset X in journal.<g>
        (holding `_mu` but not the namespace lock: other processes go on appending),
        then, under the lock, rename it into place and append ROTATE. Its readers
        replay journal.<g> from X. False if not needed, or someone else rotated."""
        with self._rotating() as mine:
            if not mine:
                return False  # another process is writing the next snapshot
            with self._mu:
                self.files.catch_up(locked=False)
                self.index.drain()
                threshold = (self._background_threshold() if background
                             else self._threshold(min_bytes))
                if self._journal.offset < threshold:
                    return False
                tmp, jgen, _ = self.files.write_next_snapshot()
            try:
                with self._locked(rotate=False):
                    done = self.files.install_next_snapshot(tmp, jgen)
            except BaseException:
                layout.unlink_quiet(tmp, self.ns_fd)
                raise
        self.rotations += done
        return done

    @contextmanager
    def _rotating(self) -> Iterator[bool]:
        """`rotate` locked (flock, not waiting): one process at a time writes the
        next snapshot in the background, so their temporary snapshots do not pile
        up (`overhead`). Yields False when another holds it (or the name is not a
        file we can lock)."""
        try:
            fd = layout.open_file("rotate", self.ns_fd, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            self._errors.record("rotate", exc, self.root)
            yield False
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # the lock goes with it
