"""A secondary tier that keeps blocks in one SQLite file.

Small on purpose (it is the subject of docs/plugins.md), but every rule of the tier
contract shows up once, and the hard parts come from the core's SDK:

- The scheduler thread only touches memory: `lookup` asks a `BoundedIndex` (every
  row of the file, by namespace and key), `submit_*` hand the job to a `JobEngine`.
  All SQLite work runs on the engine's one thread.
- The engine reports each job exactly once, after its last block, with `timeout`,
  `closed` and `io` (an exception) handled for us. Failures are per key.
- Each block is stored with its `kvtiers.sdk` checksum and verified in the slot
  on load; a bad copy is reported `corrupt` and deleted.
- The file holds at most `capacity_bytes` of blocks: the index reserves room for a
  store before it writes, evicting least recently used rows, never a row being loaded
  (pinned at submit) nor one of the storing job's own. Recency is a column, so it
  survives a restart.
- Rows carry the namespace fingerprint: another model's blocks are never served.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvtiers.errors import KvtiersError
from kvtiers.sdk import (
    BlockKey,
    BoundedIndex,
    FailureReason,
    Job,
    JobEngine,
    JobHooks,
    JobResult,
    LookupResult,
    Outcome,
    Pins,
    Reservation,
    SecondaryTier,
    StatsRecorder,
    TierContext,
    TierStats,
    TransferJob,
    Verdict,
    checksum_bytes,
    verify,
)

_TABLES = """
CREATE TABLE IF NOT EXISTS blocks (
    namespace TEXT NOT NULL,     -- Namespace.fingerprint of the model the block belongs to
    key BLOB NOT NULL,
    data BLOB NOT NULL,
    checksum BLOB NOT NULL,      -- kvtiers.sdk.checksum_bytes(data)
    last_used INTEGER NOT NULL,  -- recency tick, file-wide; smallest is evicted first
    PRIMARY KEY (namespace, key)
);
CREATE INDEX IF NOT EXISTS blocks_by_recency ON blocks (last_used);
"""


class SqliteTier(SecondaryTier):
    """Config: `path` (the file) and `capacity_bytes` (a bound on the block bytes of
    the whole file, every namespace together)."""

    persistent = True
    verifies = True

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        super().__init__(ctx, config)
        self.path = Path(config["path"]).expanduser()
        self.capacity = int(config["capacity_bytes"])
        self._ns = ctx.namespace.fingerprint
        # The file is one bounded store, so the index holds every row of it, named
        # namespace + NUL + key (a fingerprint never holds a NUL).
        self._tag = self._ns.encode() + b"\0"
        self._stats = StatsRecorder(self.capacity)
        policy = ctx.make_policy("lru", max(1, self.capacity // ctx.block_bytes))
        self._index: BoundedIndex[int] = BoundedIndex(  # name -> rowid
            policy, self.capacity, on_removed=self._removed)
        self._touched: dict[bytes, None] = {}  # recency to write down, oldest first
        self._touch_lock = threading.Lock()
        self._tick = 0
        try:
            self._db = self._open()
        except (sqlite3.Error, OSError) as exc:
            raise KvtiersError(f"sqlite tier: cannot open {self.path}: {exc}") from None
        # One thread (no store threads: loads first, then stores) owns the connection.
        self._engine = JobEngine(
            ctx,
            load=JobHooks(block=self._read, end=self._end_load),
            store=JobHooks(start=self._reserve, block=self._write, end=self._end_store),
            load_threads=1,
            store_threads=0,
            stats=self._stats,
        )

    # --- scheduler thread: memory only, never blocks on I/O -----------------------

    def lookup(self, key: BlockKey) -> LookupResult:
        hit = self._tag + key in self._index
        self._stats.lookup(hit)
        return LookupResult.HIT if hit else LookupResult.MISS

    def submit_store(self, job: TransferJob) -> None:
        self._engine.submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        # Pinned now: what lookup called a HIT is not evicted before it is read.
        pins = None if self._engine.closed else self._index.pin(self._names(job.keys))
        self._engine.submit_load(job, pins)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        names = self._names(keys)
        self._index.touch(names)
        self._remember_use(names)

    def get_finished_jobs(self) -> list[JobResult]:
        return self._engine.take_finished()

    def drain(self, timeout: float | None = None) -> bool:
        return self._engine.drain(timeout)

    def close(self) -> None:
        if self._engine.closed:
            return
        self._engine.close()  # queued jobs fail with `closed`; the thread is gone after
        try:
            with self._db:
                self._write_recency()
        except sqlite3.Error:
            self.ctx.logger.exception("sqlite tier %s: recency not saved", self.path)
        self._db.close()

    def stats(self) -> TierStats:
        return self._stats.snapshot(usage_bytes=self._index.committed_bytes)

    def _names(self, keys: Iterable[BlockKey]) -> list[bytes]:
        return [self._tag + key for key in keys]

    def _removed(self, names: list[bytes]) -> None:
        """Rows left the index: tell the manager which of ours are gone."""
        n = len(self._tag)
        self.ctx.events.removed([name[n:] for name in names if name.startswith(self._tag)])

    def _remember_use(self, names: Iterable[bytes]) -> None:
        with self._touch_lock:
            for name in names:
                self._touched.pop(name, None)
                self._touched[name] = None

    # --- the engine's thread: owns the connection ------------------------------------

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Made here, used by the engine's one thread, then by close: never two at once.
        db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            # WAL: a kill -9 loses at most the open transaction, never a committed row.
            # synchronous=NORMAL survives process crashes; power loss may drop the last
            # commits (the design's default: no fsync per block).
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_TABLES)
            with db:  # oldest first, so the index's recency is the file's
                rows = db.execute("SELECT rowid, namespace, key, length(data), last_used"
                                  " FROM blocks ORDER BY last_used").fetchall()
                for rowid, namespace, key, size, last_used in rows:
                    self._tick = max(self._tick, last_used)
                    name = str(namespace).encode() + b"\0" + bytes(key)
                    # The capacity may have shrunk since the file was written.
                    for _, gone in self._index.add(name, rowid, size):
                        db.execute("DELETE FROM blocks WHERE rowid=?", (gone,))
        except BaseException:
            db.close()
            raise
        return db

    def _reserve(self, job: Job) -> list[int]:
        """A store's first step: room for its new blocks (evicting rows), recency for
        those already here. Returns the blocks to write."""
        room = self._index.reserve([(name, self.ctx.block_bytes)
                                    for name in self._names(job.keys)])
        job.state = (room, {})  # the reservation, and the rowids written
        self._remember_use(n for n, v in zip(room.keys, room.verdicts, strict=True)
                           if v is Verdict.PRESENT)
        with self._db:
            self._db.executemany("DELETE FROM blocks WHERE rowid=?",
                                 [(rowid,) for _, rowid in room.evicted])
            self._write_recency()
        self._stats.evicted(len(room.evicted))
        todo = []
        for i, verdict in enumerate(room.verdicts):
            if verdict is Verdict.RESERVED:
                todo.append(i)
            elif verdict is Verdict.PRESENT:
                job.succeed(i)
            else:  # only pinned rows or this job's own are left
                job.fail(i, FailureReason.FULL)
        return todo

    def _write(self, job: Job, i: int) -> Outcome:
        data = bytes(self.ctx.pool.block(job.slots[i]))
        with self._db:
            # REPLACE: a row the index forgot (its delete failed) makes way.
            row = self._db.execute(
                "INSERT OR REPLACE INTO blocks VALUES (?, ?, ?, ?, ?)",
                (self._ns, job.keys[i], data, checksum_bytes(data), self._next_tick()),
            )
        job.state[1][i] = row.lastrowid
        return None

    def _end_store(self, job: Job) -> None:
        """Written rows become visible to lookup (only now: a HIT is always readable)."""
        if job.state is None:  # never started: timeout or closed
            return
        room: Reservation[int] = job.state[0]
        with room:
            for i, rowid in job.state[1].items():
                if job.succeeded(i):
                    room.commit(room.keys[i], rowid)

    def _read(self, job: Job, i: int) -> Outcome:
        name = self._tag + job.keys[i]
        pins: Pins[int] | None = job.state
        rowid = pins.locations[i] if pins is not None else self._index.get(name)
        row = None if rowid is None else self._db.execute(
            "SELECT data, checksum FROM blocks WHERE rowid=?", (rowid,)).fetchone()
        if row is None:
            if rowid is not None:  # deleted behind our back: forget it too
                self._index.remove(name, rowid)
            return FailureReason.MISSING
        data, checksum = row
        dest = self.ctx.pool.block(job.slots[i])
        intact = isinstance(data, bytes) and len(data) == len(dest)
        if intact:
            dest[:] = data
        # Verify what now sits in the slot: that is what the engine would read.
        if not (intact and verify(dest, checksum)):
            with self._db:
                self._db.execute("DELETE FROM blocks WHERE rowid=?", (rowid,))
            self._index.remove(name, rowid)
            return FailureReason.CORRUPT
        return None

    def _end_load(self, job: Job) -> None:
        if job.state is not None:
            job.state.release()
        used = [self._tag + k for i, k in enumerate(job.keys) if job.succeeded(i)]
        self._index.touch(used)  # a load is a use
        self._remember_use(used)

    def _write_recency(self) -> None:
        """Write down the uses remembered since the last time (in a transaction)."""
        with self._touch_lock:
            touched, self._touched = self._touched, {}
        rows = [(self._next_tick(), rowid) for name in touched
                if (rowid := self._index.get(name)) is not None]
        self._db.executemany("UPDATE blocks SET last_used=? WHERE rowid=?", rows)

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick
