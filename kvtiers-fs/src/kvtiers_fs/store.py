"""`RootStore`: one namespace on one root directory - its index, its capacity bound,
and the journal that several processes share.

Capacity accounting across processes
------------------------------------
Every process that opens the namespace keeps the whole index in memory (committed
blocks in the eviction policy, with their file sizes, plus pending intents) and
keeps it current by reading one shared, append-only journal (journal.py). Usage is
a fold of that journal: committed bytes plus bytes of pending intents, whoever
wrote them. Changes are appended under an exclusive flock(2) of `<ns>/lock`, and a
writer always reads the journal to its end before it decides anything, so every
decision sees every other writer's reservations:

1. reserve (one critical section per store job): catch up; for each key not
   present or pending anywhere, evict victims by policy until it fits (unpinned in
   this process; their REMOVE records go first), append `[REMOVE..., ADD...]` as
   one frame, rename each victim's file to the temporary name of the block it
   made room for (`_recycle`) or unlink it, release the lock;
2. write the block files (no lock: into the recycled file or a new one under the
   temporary name, then rename);
3. commit (one critical section): append `[COMMIT or ABORT per key]`.

So usage never exceeds `capacity_bytes`: a writer's blocks in flight are already
counted as its pending intents (the issue allows an overshoot of one job per
writer; this design needs none). Two writers never write one file: a key pending
anywhere counts as present.

Crashes: a writer that dies (kill -9, at any instant) leaves at most its
uncommitted intents and its last frame's unlinks; the next lock holder settles
them (recovery.py). After that, usage is exactly the bytes of the complete block
files on disk.

Restart. `snapshot.<gen>` holds the index (entries in eviction order, so recency
survives) at the start of `journal.<gen>`; start-up reads the newest snapshot and
replays its journal - no scan of the block files, so a million blocks load in a
few seconds. When the journal grows past max(16 MiB, twice the snapshot), the lock
holder writes `snapshot.<gen+1>` and `journal.<gen+1>` and appends ROTATE to the
old journal; readers follow the ROTATE without reloading. If the journal or the
snapshot is damaged (power loss without `durable`), the lock holder rebuilds the
index from a scan of the block files (recovery.py).

Threads: `contains`, `pin`, `unpin` and `touch` are for the scheduler thread and
only take `_state` (dictionary work). Everything that reads or appends the journal
runs on I/O or probe threads under `_mu` (and the flock for appends).
"""

from __future__ import annotations

import enum
import errno
import fcntl
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict

from kvtiers.namespace import Namespace
from kvtiers.policies.base import EvictionPolicy

from kvtiers_fs import journal as jr
from kvtiers_fs import layout
from kvtiers_fs.errorlog import ErrorLog
from kvtiers_fs.journal import Record
from kvtiers_fs.layout import Ident
from kvtiers_fs.recovery import RecoveryMixin

#: rotate the journal once it is larger than this and twice the snapshot
ROTATE_MIN_BYTES = 16 << 20
#: ... and at a clean close once it is larger than this (and twice the snapshot)
CLOSE_ROTATE_BYTES = 1 << 20
#: real seconds between looks for dead writers that left state behind
RECONCILE_EVERY_S = 2.0
#: touches remembered for the journal between flushes (older ones are dropped)
MAX_BUFFERED_TOUCHES = 1 << 16
NAMESPACE_FILE = "NAMESPACE.json"


class Verdict(enum.Enum):
    GRANTED = "granted"  # reserved: write the block, then commit or abort it
    # granted, and an evicted block's file waits at the temporary name: overwrite it
    RECYCLED = "recycled"
    PRESENT = "present"  # stored already, or being stored by another writer
    FULL = "full"  # cannot fit: nothing evictable left


def new_writer_id() -> int:
    while True:
        wid = int.from_bytes(os.urandom(8), "little")
        if wid:
            return wid


class RootStore(RecoveryMixin):
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
        errors: ErrorLog,
        logger: logging.Logger,
    ):
        self.root = root
        self.namespace = namespace
        self.fingerprint = namespace.fingerprint
        self.capacity_bytes = capacity_bytes
        self.durable = durable
        self.writer = new_writer_id()
        self._policy_factory = policy_factory
        self._errors = errors
        self._log = logger
        self._mu = threading.RLock()  # journal position and appends, in this process
        self._state = threading.Lock()  # the index; held for dictionary work only
        self.policy: EvictionPolicy = policy_factory()
        self.pending: dict[Ident, tuple[int, int]] = {}  # ident -> (writer, bytes)
        self.last_deletes: dict[int, list[Ident]] = {}
        self.usage = 0  # committed + pending bytes, every writer's
        self._pins: dict[Ident, int] = {}
        self._touches: dict[Ident, None] = {}
        self._last_touch_flush = time.monotonic()
        self._last_reconcile = 0.0
        self._outbox: list[Record] = []  # records that could not be appended yet
        self.gen = 0
        self._jfd = -1
        self._offset = 0
        self.ns_fd = self.blocks_fd = self._writers_fd = self._lock_fd = self._me_fd = -1
        self.evictions = 0
        self.recycled = 0  # evicted files reused as new blocks' files
        self.reloads = 0
        self.closed = False

    # -- opening and closing ----------------------------------------------------

    def open(self) -> None:
        """Create or open the namespace directory, register this writer, load the
        index and reconcile writers that died. Raises OSError."""
        root_fd = layout.open_root(self.root)
        try:
            self.ns_fd = layout.open_dir(self.fingerprint, root_fd, create=True)
        finally:
            os.close(root_fd)
        self._write_namespace_file()
        self.blocks_fd = layout.open_dir("blocks", self.ns_fd, create=True)
        self._writers_fd = layout.open_dir("writers", self.ns_fd, create=True)
        self._lock_fd = layout.open_file("lock", self.ns_fd, os.O_RDWR | os.O_CREAT)
        self._register()
        with self._mu:
            self._load(have_lock=False)
            with self._locked():
                self._sweep_writers()
                self._reconcile(force=True)

    def _write_namespace_file(self) -> None:
        try:
            layout.read_small_file(NAMESPACE_FILE, self.ns_fd)
            return
        except FileNotFoundError:
            pass
        ns = self.namespace
        doc = {
            "fingerprint": self.fingerprint,
            "model": ns.model,
            "revision": ns.revision,
            "format_version": ns.format_version,
            "groups": [asdict(g) for g in ns.groups],
            "layout_version": layout.LAYOUT_VERSION,
        }
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        layout.write_small_file(NAMESPACE_FILE, self.ns_fd, data, durable=self.durable)

    def _register(self) -> None:
        """Hold `writers/<id>` locked for as long as this store lives. Locked under a
        temporary name first, so nobody ever sees it unlocked and thinks us dead."""
        name = f"{self.writer:016x}"
        tmp = f".{name}{layout.TMP_SUFFIX}"
        fd = layout.open_file(tmp, self._writers_fd, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, name, src_dir_fd=self._writers_fd, dst_dir_fd=self._writers_fd)
        self._me_fd = fd

    def close(self) -> None:
        """Flush touches, unregister, close descriptors. Idempotent; never raises."""
        if self.closed:
            return
        self.closed = True
        try:
            # Touches go to the journal; a journal grown past a few MiB becomes a
            # snapshot, so the next start-up (and `list_namespaces`) reads less.
            with self._locked():
                self._maybe_rotate(CLOSE_ROTATE_BYTES)
        except Exception as exc:  # noqa: BLE001 - closing must not raise
            self._errors.record("close", exc)
        if self._me_fd >= 0:
            try:
                layout.unlink_quiet(f"{self.writer:016x}", self._writers_fd)
            except OSError:
                pass
        for fd in (self._jfd, self._me_fd, self._lock_fd, self._writers_fd, self.blocks_fd,
                   self.ns_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._jfd = self._me_fd = self._lock_fd = self._writers_fd = -1
        self.blocks_fd = self.ns_fd = -1

    # -- the scheduler side: memory only ----------------------------------------

    def contains(self, idn: Ident) -> bool:
        with self._state:
            return idn in self.policy

    def pin(self, idns: Iterable[Ident]) -> None:
        with self._state:
            for idn in idns:
                n = self._pins.get(idn, 0)
                self._pins[idn] = n + 1
                if n == 0:
                    self.policy.pin(idn)

    def unpin(self, idns: Iterable[Ident]) -> None:
        with self._state:
            for idn in idns:
                n = self._pins.get(idn, 0) - 1
                if n > 0:
                    self._pins[idn] = n
                    continue
                self._pins.pop(idn, None)
                self.policy.unpin(idn)

    def touch(self, idns: Iterable[Ident]) -> None:
        """Refresh recency now; the journal learns it at the next flush."""
        with self._state:
            for idn in idns:
                if idn in self.policy:
                    self.policy.touch(idn)
                    self._touches.pop(idn, None)
                    self._touches[idn] = None
            while len(self._touches) > MAX_BUFFERED_TOUCHES:
                self._touches.pop(next(iter(self._touches)))

    def stats(self) -> tuple[int, int, int]:
        """(usage bytes, committed blocks, pending intents)."""
        with self._state:
            return self.usage, len(self.policy), len(self.pending)

    # -- I/O-thread side --------------------------------------------------------

    def sync(self) -> None:
        """Read what other writers appended (no lock needed to read)."""
        with self._mu:
            self._catch_up(locked=False)

    def reserve(self, items: list[tuple[Ident, int]]) -> tuple[list[Verdict], int]:
        """Reserve room for blocks (ident, file bytes); see the module doc. Returns a
        verdict per item and the number of blocks evicted to make room. Raises
        OSError when the journal cannot be appended (nothing reserved then)."""
        with self._locked():
            verdicts: list[Verdict] = []
            victims: list[tuple[Ident, int]] = []
            adds: list[Record] = []
            with self._state:
                usage, cap, full = self.usage, self.capacity_bytes, False
                reuse: dict[Ident, tuple[Ident, int]] = {}  # granted -> a victim, its size
                for idn, size in items:
                    if idn in self.policy or idn in self.pending:
                        verdicts.append(Verdict.PRESENT)
                        continue
                    if full or size > cap:
                        verdicts.append(Verdict.FULL)
                        continue
                    first = len(victims)
                    while usage + size > cap:
                        got = self.policy.evict_items(1)
                        if not got:
                            break
                        vid, vsize = got[0]
                        victims.append((vid, vsize))  # type: ignore[arg-type]
                        usage -= vsize
                    if usage + size > cap:
                        full = True
                        verdicts.append(Verdict.FULL)
                        continue
                    if len(victims) > first and victims[first][1] == size:
                        reuse[idn] = victims[first]
                    usage += size
                    adds.append(Record(jr.ADD, self.writer, size, idn))
                    verdicts.append(Verdict.GRANTED)
            if not adds and not victims:
                return verdicts, 0
            removes = [Record(jr.REMOVE, self.writer, s, i) for i, s in victims]
            try:
                self._append(removes + adds)
            except OSError:
                with self._state:
                    for vid, vsize in victims:  # back in, as the newest: nothing happened
                        self.policy.insert(vid, vsize)
                raise
            with self._state:
                self.usage = usage
                for rec in adds:
                    self.pending[rec.ident] = (self.writer, rec.size)
                self._set_last_deletes(self.writer, [i for i, _ in victims])
            recycled = {idn for idn, (v, size) in reuse.items() if self._recycle(v, idn, size)}
            taken = {reuse[idn][0] for idn in recycled}
            self._unlink_blocks([i for i, _ in victims if i not in taken])
            verdicts = [Verdict.RECYCLED if v is Verdict.GRANTED and idn in recycled else v
                        for (idn, _), v in zip(items, verdicts, strict=True)]
            self.evictions += len(victims)
            self.recycled += len(taken)
            return verdicts, len(victims)

    def _recycle(self, victim: Ident, idn: Ident, size: int) -> bool:
        """Move the file of `victim` (evicted: its REMOVE is in the journal) to the
        temporary name of `idn`, so that the store overwrites blocks the filesystem
        has already allocated instead of allocating new ones (on ext4 an O_DIRECT
        write into allocated blocks is about twice as fast: no extent allocation,
        no unwritten-extent conversion). Holds the lock. False (the caller unlinks
        the victim) when the victim is not a regular file of `size` bytes, or
        anything fails."""
        src = self._shard_or_none(victim)
        if src is None:
            return False
        try:
            name = layout.block_name(victim)
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                return False
            dst = self.shard_fd(idn, create=True)
            try:
                os.rename(name, layout.tmp_name(idn, self.writer), src_dir_fd=src,
                          dst_dir_fd=dst)
            finally:
                os.close(dst)
            return True
        except OSError:
            return False
        finally:
            os.close(src)

    def commit(self, done: list[Ident], failed: list[Ident]) -> None:
        """End reserved intents: `done` blocks are in place, `failed` are not (their
        temporary files are gone). If the journal cannot take the commits, the
        written files are removed and everything is aborted later; raises OSError."""
        if not done and not failed:
            return
        records = [Record(jr.COMMIT, self.writer, 0, i) for i in done]
        records += [Record(jr.ABORT, self.writer, 0, i) for i in failed]
        self._unlink_tmps(failed)  # a recycled file whose store never ran (timeout, close)
        with self._mu:
            try:
                with self._locked():
                    self._append(records)
                    self._apply_own(records)
            except OSError:
                self._unlink_blocks(done)
                self._outbox.extend(Record(jr.ABORT, self.writer, 0, i) for i in done + failed)
                raise

    def remove(self, idn: Ident, *, delete_file: bool) -> bool:
        """Drop a committed block from the index (REMOVE and unlink it when
        `delete_file`, else FORGET: a file that is not ours to delete). False if
        it was not in the index."""
        with self._locked():
            with self._state:
                size = self.policy.get(idn)
                if size is None or idn not in self.policy:
                    return False
            op = jr.REMOVE if delete_file else jr.FORGET
            rec = Record(op, self.writer, size, idn)
            self._append([rec])
            self._apply_own([rec])
            if delete_file:
                self._unlink_blocks([idn])
            return True

    def flush_touches(self, force: bool = False) -> None:
        """Append buffered touches (at most once a second unless `force`)."""
        if not self._touches:
            return
        if not force and time.monotonic() - self._last_touch_flush < 1.0:
            return
        with self._locked():
            self._flush_touches_locked()

    def shard_fd(self, idn: Ident, create: bool) -> int:
        """A descriptor of the shard directory of `idn` (the caller closes it)."""
        return layout.open_dir(layout.shard_of(idn), self.blocks_fd, create=create)

    # -- the journal --------------------------------------------------------------

    @contextmanager
    def _flock(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The namespace lock, with the index caught up to the end of the journal,
        leftovers of dead writers reconciled now and then, and queued records
        appended first."""
        with self._mu, self._flock():
            self._catch_up(locked=True)
            if self._outbox:
                out, self._outbox = self._outbox, []
                try:
                    self._append(out)
                    self._apply_own(out)
                except OSError:
                    self._outbox = out + self._outbox
            if time.monotonic() - self._last_reconcile > RECONCILE_EVERY_S:
                self._reconcile()
            if self._touches:
                self._flush_touches_locked()
            yield
            self._maybe_rotate()

    def _append(self, records: list[Record]) -> None:
        """Append one frame at the end of the journal (we hold the lock and have read
        to the end). A partial append is cut off again."""
        data = jr.frame(records)
        try:
            n = os.pwrite(self._jfd, data, self._offset)
            if n != len(data):
                raise OSError(errno.ENOSPC, "short journal append")
            if self.durable:
                os.fdatasync(self._jfd)
        except OSError as exc:
            try:
                os.ftruncate(self._jfd, self._offset)
            except OSError:
                pass
            self._errors.record("journal", exc)
            raise
        self._offset += len(data)

    def _apply_own(self, records: list[Record]) -> None:
        with self._state:
            self._apply(records)

    def _catch_up(self, *, locked: bool) -> None:
        """Apply every complete frame after our offset. Holding the lock, also cut a
        torn tail, notice an interrupted rotation, and rebuild a damaged journal."""
        for _ in range(100):
            try:
                tail = jr.read_frames(self._jfd, self._offset)
            except jr.JournalCorrupt as exc:
                if not locked:
                    return  # the next lock holder deals with it
                self._log.error("kvtiers-fs %s: %s; rebuilding the index from the block files",
                                self.root, exc)
                self._rebuild()
                continue
            switch = None
            with self._state:
                for records in tail.frames:
                    switch = self._apply(records)
                    if switch is not None:
                        break
            if switch is not None:
                op, gen = switch
                if op == jr.ROTATE and self._follow_rotation(gen):
                    continue
                self._load(have_lock=locked)
                continue
            self._offset = tail.offset
            if locked:
                if tail.torn:
                    os.ftruncate(self._jfd, self._offset)  # a dead writer's torn append
                if self._exists(jr.snapshot_name(self.gen + 1)):
                    # A rotation or rebuild whose ROTATE/RELOAD we never saw: its
                    # writer died half way. The snapshot is authoritative.
                    self._load(have_lock=True)
                    continue
            return
        raise OSError(errno.EIO, "the journal keeps changing under us")

    def _apply(self, records: list[Record]) -> tuple[int, int] | None:
        """Fold one frame into the index (holding `_state`). Returns (op, gen) for
        ROTATE/RELOAD, which end a journal."""
        dels: list[Ident] = []
        policy, pending = self.policy, self.pending
        for r in records:
            op, idn = r.op, r.ident
            if op == jr.ADD:
                if idn not in pending and idn not in policy:
                    pending[idn] = (r.writer, r.size)
                    self.usage += r.size
            elif op == jr.COMMIT:
                p = pending.pop(idn, None)
                if p is not None:
                    if idn in policy:
                        self.usage -= p[1]
                    else:
                        policy.insert(idn, p[1])
            elif op == jr.ABORT:
                p = pending.pop(idn, None)
                if p is not None:
                    self.usage -= p[1]
            elif op in (jr.REMOVE, jr.FORGET):
                if idn in policy:
                    self.usage -= policy.get(idn)
                    policy.remove(idn)
                if op == jr.REMOVE:
                    dels.append(idn)
            elif op == jr.TOUCH:
                policy.touch(idn)
            elif op == jr.GONE:
                self.last_deletes.pop(r.size, None)
            elif op in (jr.ROTATE, jr.RELOAD):
                return op, r.size
        if records:
            self._set_last_deletes(records[0].writer, dels)
        return None

    def _set_last_deletes(self, writer: int, dels: list[Ident]) -> None:
        # A writer's next frame proves it finished unlinking the previous one's.
        if dels:
            self.last_deletes[writer] = dels
        else:
            self.last_deletes.pop(writer, None)

    def _follow_rotation(self, gen: int) -> bool:
        try:
            fd = layout.open_file(jr.journal_name(gen), self.ns_fd, os.O_RDWR)
        except FileNotFoundError:
            return False  # we fell more than a generation behind: reload
        os.close(self._jfd)
        self._jfd, self.gen, self._offset = fd, gen, 0
        return True

    def _exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.ns_fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def _maybe_rotate(self, min_bytes: int = ROTATE_MIN_BYTES) -> None:
        with self._state:
            entries = len(self.policy)
        if self._offset < max(min_bytes, 2 * jr.RECORD.size * entries):
            return
        new = self.gen + 1
        try:
            self._write_generation(new)
            self._append([Record(jr.ROTATE, self.writer, new, b"")])
        except OSError as exc:
            self._errors.record("rotate", exc)
            return
        self._follow_rotation(new)
        self._remove_old_generations(new)

    def _write_generation(self, gen: int) -> None:
        """journal.<gen> (empty), then snapshot.<gen> of the current index."""
        fd = layout.open_file(jr.journal_name(gen), self.ns_fd,
                              os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        os.close(fd)
        with self._state:
            order = self.policy.export()
            pending = list(self.pending.items())
            lastdel = [(w, i) for w, ids in self.last_deletes.items() for i in ids]
            nbytes = self.usage - sum(s for _, (_, s) in pending)
        # Sizes are read without `_state` so that lookups do not wait for a million
        # of them. Nothing removes entries meanwhile (that needs `_mu`, which we
        # hold); a None is a pin or unpin caught moving the entry: ask again, locked.
        get = self.policy.get
        sizes = [get(idn) for idn in order]
        if None in sizes:
            with self._state:
                sizes = [s if s is not None else get(i) for i, s in zip(order, sizes)]
        recs = [Record(jr.ENTRY, 0, s, i) for i, s in zip(order, sizes) if s is not None]
        recs += [Record(jr.ADD, w, s, i) for i, (w, s) in pending]
        recs += [Record(jr.LASTDEL, w, 0, i) for w, i in lastdel]
        data = jr.pack_snapshot(gen, recs, len(order), nbytes)
        layout.write_small_file(jr.snapshot_name(gen), self.ns_fd, data, durable=self.durable)

    def _remove_old_generations(self, gen: int) -> None:
        for name in os.listdir(self.ns_fd):
            g = jr.generation_of(name, "snapshot")
            if g is not None and g < gen:
                layout.unlink_quiet(name, self.ns_fd)
            g = jr.generation_of(name, "journal")
            if g is not None and g < gen - 1:
                layout.unlink_quiet(name, self.ns_fd)
            if name.startswith(".snapshot.") and name.endswith(layout.TMP_SUFFIX):
                layout.unlink_quiet(name, self.ns_fd)  # a dead rotator's; we hold the lock

    def _newest_generation(self) -> tuple[int | None, int]:
        """(newest snapshot generation or None, highest generation named at all)."""
        newest, highest = None, 0
        for name in os.listdir(self.ns_fd):
            for prefix in ("snapshot", "journal"):
                g = jr.generation_of(name, prefix)
                if g is None:
                    continue
                highest = max(highest, g)
                if prefix == "snapshot":
                    newest = g if newest is None else max(newest, g)
        return newest, highest

    def _load(self, *, have_lock: bool) -> None:
        """Replace the in-memory index by the newest snapshot plus its journal."""
        self.reloads += 1
        for _ in range(20):
            gen, _highest = self._newest_generation()
            if gen is None:
                with self._maybe_flock(have_lock):
                    if self._newest_generation()[0] is None:
                        self._rebuild(first=True)
                        return
                continue
            try:
                data = layout.read_file(jr.snapshot_name(gen), self.ns_fd)
                snap_gen = jr.read_snapshot_head(data)[0]
                if snap_gen != gen:
                    raise ValueError("snapshot names another generation")
                body = jr.parse_snapshot(data).body
            except FileNotFoundError:
                continue
            except (ValueError, OSError) as exc:
                self._log.error("kvtiers-fs %s: %s is unusable (%s); rebuilding the index "
                                "from the block files", self.root, jr.snapshot_name(gen), exc)
                with self._maybe_flock(have_lock):
                    if self._newest_generation()[0] == gen:
                        self._rebuild()
                        return
                continue
            try:
                jfd = layout.open_file(jr.journal_name(gen), self.ns_fd, os.O_RDWR)
            except FileNotFoundError:
                with self._maybe_flock(have_lock):
                    if self._newest_generation()[0] == gen:  # a rotator died half way
                        os.close(layout.open_file(jr.journal_name(gen), self.ns_fd,
                                                  os.O_RDWR | os.O_CREAT))
                continue
            self._install(gen, jfd, jr.raw_records(body))
            self._catch_up(locked=have_lock)
            return
        raise OSError(errno.EIO, f"cannot load the index of {self.root}")

    @contextmanager
    def _maybe_flock(self, have_lock: bool) -> Iterator[None]:
        if have_lock:
            yield
        else:
            with self._flock():
                yield

    def _install(self, gen: int, jfd: int,
                 records: Iterable[tuple[int, int, int, int, bytes]]) -> None:
        """Replace the index by a snapshot's records (`journal.raw_records`)."""
        policy = self._policy_factory()
        insert = policy.insert
        pending: dict[Ident, tuple[int, int]] = {}
        lastdel: dict[int, list[Ident]] = {}
        usage = 0
        entry, add, lastdel_op = jr.ENTRY, jr.ADD, jr.LASTDEL
        for op, n, writer, size, raw in records:  # a million times at start-up: lean
            if op == entry:
                insert(raw[:n], size)
                usage += size
            elif op == add:
                pending[raw[:n]] = (writer, size)
                usage += size
            elif op == lastdel_op:
                lastdel.setdefault(writer, []).append(raw[:n])
        with self._state:
            for idn in self._pins:
                policy.pin(idn)
            self.policy, self.pending, self.last_deletes, self.usage = (
                policy, pending, lastdel, usage)
        if self._jfd >= 0:
            os.close(self._jfd)
        self._jfd, self.gen, self._offset = jfd, gen, 0

    def _shard_or_none(self, idn: Ident) -> int | None:
        try:
            return self.shard_fd(idn, create=False)
        except FileNotFoundError:
            return None

    def _unlink_blocks(self, idns: Iterable[Ident]) -> None:
        self._unlink_each(idns, layout.block_name)

    def _unlink_tmps(self, idns: Iterable[Ident]) -> None:
        """This writer's temporary files of `idns`, where they are left."""
        self._unlink_each(idns, lambda idn: layout.tmp_name(idn, self.writer))

    def _unlink_each(self, idns: Iterable[Ident], name: Callable[[Ident], str]) -> None:
        for idn in idns:
            shard = self._shard_or_none(idn)
            if shard is None:
                continue
            try:
                layout.unlink_quiet(name(idn), shard)
            except OSError as exc:
                self._errors.record("unlink", exc)
            finally:
                os.close(shard)

    def _flush_touches_locked(self) -> None:
        with self._state:
            idns = [i for i in self._touches if i in self.policy]
            self._touches.clear()
        self._last_touch_flush = time.monotonic()
        if idns:
            try:
                self._append([Record(jr.TOUCH, self.writer, 0, i) for i in idns])
            except OSError:
                pass  # recency is best effort; the in-memory order already has them
