"""A secondary tier that keeps blocks in one SQLite file.

Small on purpose (it is the subject of docs/plugins.md), but every rule of the tier
contract shows up once:

- The scheduler thread only touches memory: `lookup` reads an in-memory index of this
  namespace's keys, `submit_*` and `touch` enqueue. All SQLite work runs on one worker
  thread, which opens and owns the connection.
- Each job is reported exactly once, after the worker is done with its slots. Failures
  are per key (`FailureReason`), never exceptions.
- Each block is stored with its `kvtiers.integrity` checksum and verified in the slot on
  load; a bad copy is reported `corrupt` and deleted.
- The file holds at most `capacity_bytes` of blocks: least recently used rows go first.
  Recency is a column, so it survives a restart.
- Rows carry the namespace fingerprint: another model's blocks are never served.

Loads and stores run on the one worker thread in order, so a block being loaded can
never be evicted under it (the contract's "pinned blocks are never evicted").
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvtiers import integrity
from kvtiers.errors import KvtiersError
from kvtiers.jobs import FailureReason, JobResult, TransferJob
from kvtiers.keys import BlockKey
from kvtiers.lookup import LookupResult
from kvtiers.stats import StatsRecorder, TierStats
from kvtiers.tier import SecondaryTier, TierContext

_TABLES = """
CREATE TABLE IF NOT EXISTS blocks (
    namespace TEXT NOT NULL,     -- Namespace.fingerprint of the model the block belongs to
    key BLOB NOT NULL,
    data BLOB NOT NULL,
    checksum BLOB NOT NULL,      -- kvtiers.integrity.checksum_bytes(data)
    last_used INTEGER NOT NULL,  -- recency tick, file-wide; smallest is evicted first
    PRIMARY KEY (namespace, key)
);
CREATE INDEX IF NOT EXISTS blocks_by_recency ON blocks (last_used);
"""

_Op = tuple[str, Any]  # ("store" | "load", TransferJob) or ("touch", [keys])


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
        self._stats = StatsRecorder(self.capacity)
        self._lock = threading.Lock()  # guards the fields below, shared with the worker
        self._idle = threading.Condition(self._lock)
        self._index: set[BlockKey] = set()
        self._results: list[JobResult] = []
        self._pending = 0
        self._closed = False
        # Worker-only state: the connection, file-wide usage and the recency tick.
        self._usage = 0
        self._tick = 0
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        # A daemon: a tier nobody closed must not keep the interpreter from exiting.
        self._thread = threading.Thread(
            target=self._run, name=f"kvtiers-sqlite {self.path}", daemon=True
        )
        self._thread.start()
        self._opened.wait()
        if self._open_error is not None:
            self._thread.join()
            raise KvtiersError(f"sqlite tier: cannot open {self.path}: {self._open_error}")

    # --- scheduler thread: memory only, never blocks on I/O -----------------------

    def lookup(self, key: BlockKey) -> LookupResult:
        with self._lock:
            hit = key in self._index
        self._stats.lookup(hit)
        return LookupResult.HIT if hit else LookupResult.MISS

    def submit_store(self, job: TransferJob) -> None:
        self._submit("store", job)

    def submit_load(self, job: TransferJob) -> None:
        self._submit("load", job)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        self._queue.put(("touch", list(keys)))

    def get_finished_jobs(self) -> list[JobResult]:
        with self._lock:
            done, self._results = self._results, []
        return done

    def drain(self, timeout: float | None = None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True  # the worker now fails what is still queued with CLOSED
        self._queue.put(None)
        self._thread.join()

    def stats(self) -> TierStats:
        return self._stats.snapshot(usage_bytes=self._usage)

    def _submit(self, kind: str, job: TransferJob) -> None:
        with self._lock:
            if not self._closed:
                self._pending += 1
                self._queue.put((kind, job))
                return
            self._results.append(JobResult.all_failed(job, FailureReason.CLOSED))

    # --- worker thread: owns the connection ------------------------------------------

    def _run(self) -> None:
        try:
            db = self._open()
        except Exception as exc:  # noqa: BLE001 - reported to the constructor
            self._open_error = exc
            self._opened.set()
            return
        self._opened.set()
        try:
            while (op := self._queue.get()) is not None:
                kind, payload = op
                if kind == "touch":
                    self._guarded(db, self._touch, payload)
                    continue
                result = self._execute(db, kind, payload)
                self._stats.job(result, load=kind == "load")
                with self._idle:
                    self._results.append(result)
                    self._pending -= 1
                    self._idle.notify_all()
        finally:
            db.close()

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path)  # check_same_thread: only this thread may use it
        try:
            # WAL: a kill -9 loses at most the open transaction, never a committed row.
            # synchronous=NORMAL survives process crashes; power loss may drop the last
            # commits (the design's default: no fsync per block).
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_TABLES)
            self._reload(db)
            with db:  # the capacity may have shrunk since the file was written
                self._make_room(db, 0, protect_from=self._tick + 1)
        except BaseException:
            db.close()
            raise
        return db

    def _reload(self, db: sqlite3.Connection) -> None:
        """Rebuild the in-memory state from the file: at open, and after a failed job
        (whose transaction was rolled back)."""
        keys = {k for (k,) in db.execute("SELECT key FROM blocks WHERE namespace=?", (self._ns,))}
        self._usage, self._tick = db.execute(
            "SELECT COALESCE(SUM(length(data)), 0), COALESCE(MAX(last_used), 0) FROM blocks"
        ).fetchone()
        with self._lock:
            self._index = keys

    def _guarded(self, db: sqlite3.Connection, fn: Any, *args: Any) -> bool:
        """Run `fn(db, *args)`. An error (a damaged file, a full disk) is logged and
        costs misses only; its transaction was rolled back, so resync from the file."""
        try:
            fn(db, *args)
            return True
        except Exception:  # noqa: BLE001
            self.ctx.logger.exception("sqlite tier %s: operation failed", self.path)
            with contextlib.suppress(Exception):  # unreadable: loads will report missing
                self._reload(db)
            return False

    def _execute(self, db: sqlite3.Connection, kind: str, job: TransferJob) -> JobResult:
        if self._closed:
            return JobResult.all_failed(job, FailureReason.CLOSED)
        if job.deadline is not None and self.ctx.clock() > job.deadline:
            return JobResult.all_failed(job, FailureReason.TIMEOUT)
        start = time.perf_counter()
        result = JobResult(job.job_id)
        work = self._load if kind == "load" else self._store
        if not self._guarded(db, work, job, result):
            result = JobResult.all_failed(job, FailureReason.IO)
        result.seconds = time.perf_counter() - start
        return result

    def _store(self, db: sqlite3.Connection, job: TransferJob, result: JobResult) -> None:
        protect_from = self._tick + 1  # rows this job writes or refreshes stay
        added: set[BlockKey] = set()
        with db:  # one transaction per job
            for key, slot in zip(job.keys, job.slots, strict=True):
                if (key in self._index or key in added) and db.execute(
                    "UPDATE blocks SET last_used=? WHERE namespace=? AND key=?",
                    (self._next_tick(), self._ns, key),
                ).rowcount:  # present: refresh its recency only
                    result.ok.append(key)
                    continue
                data = bytes(self.ctx.pool.block(slot))
                if not self._make_room(db, len(data), protect_from):
                    result.failed[key] = FailureReason.FULL
                    continue
                db.execute(
                    "INSERT INTO blocks VALUES (?, ?, ?, ?, ?)",
                    (self._ns, key, data, integrity.checksum_bytes(data), self._next_tick()),
                )
                self._usage += len(data)
                added.add(key)
                result.ok.append(key)
                result.bytes_moved += len(data)
        with self._lock:  # visible to lookup only once committed
            self._index |= added

    def _load(self, db: sqlite3.Connection, job: TransferJob, result: JobResult) -> None:
        with db:
            for key, slot in zip(job.keys, job.slots, strict=True):
                row = db.execute(
                    "SELECT rowid, data, checksum, length(data) FROM blocks"
                    " WHERE namespace=? AND key=?",
                    (self._ns, key),
                ).fetchone()
                if row is None:
                    result.failed[key] = FailureReason.MISSING
                    continue
                rowid, data, checksum, size = row
                dest = self.ctx.pool.block(slot)
                intact = isinstance(data, bytes) and len(data) == len(dest)
                if intact:
                    dest[:] = data
                # Verify what now sits in the slot: that is what the engine would read.
                if not (intact and integrity.verify(dest, checksum)):
                    self._delete(db, rowid, key, size)
                    result.failed[key] = FailureReason.CORRUPT
                    continue
                tick = self._next_tick()
                db.execute("UPDATE blocks SET last_used=? WHERE rowid=?", (tick, rowid))
                result.ok.append(key)
                result.bytes_moved += size

    def _touch(self, db: sqlite3.Connection, keys: list[BlockKey]) -> None:
        with db:
            db.executemany(
                "UPDATE blocks SET last_used=? WHERE namespace=? AND key=?",
                [(self._next_tick(), self._ns, key) for key in keys],
            )

    def _make_room(self, db: sqlite3.Connection, size: int, protect_from: int) -> bool:
        """Evict least recently used rows (of any namespace: the bound is the file's)
        until `size` more bytes fit. Rows with a tick >= `protect_from` are kept."""
        if size > self.capacity:
            return False
        while self._usage + size > self.capacity:
            row = db.execute(
                "SELECT rowid, namespace, key, length(data) FROM blocks WHERE last_used < ?"
                " ORDER BY last_used LIMIT 1",
                (protect_from,),
            ).fetchone()
            if row is None:
                return False
            rowid, namespace, key, row_bytes = row
            self._delete(db, rowid, key if namespace == self._ns else None, row_bytes)
            self._stats.evicted()
        return True

    def _delete(self, db: sqlite3.Connection, rowid: int, key: BlockKey | None, size: int) -> None:
        db.execute("DELETE FROM blocks WHERE rowid=?", (rowid,))
        self._usage -= size
        if key is not None:
            with self._lock:
                self._index.discard(key)

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick
