"""`ToyTier`: a small, honest tier written for the suite's own tests, with switches
that each put one bug into it, so that each conformance test can be shown to fail
on the bug it is about while the tier without bugs passes the whole suite.

It is its own code, not the `memory` tier's: the proofs must not depend on the
internals of a tier that is rewritten under them. Blocks live in a dict; the
eviction policy is a registered one (`eviction_policy`, default "lru") holding
committed blocks only; pins are counted per key; a store job reserves room for
its new blocks before copying and pins its present ones, so eviction never takes
a pinned block nor one of the job's own. `threads` I/O threads take loads before
stores unless `loads_first` is false. One lock, held for dictionary work (and,
on disk, for writing or deleting one block file).

With `root_dir` the tier is persistent: each committed block is also a file
`<root_dir>/<namespace fingerprint>/blocks/<key hex>`, deleted when the block
leaves; `close` writes the recency order (least recently used first) to `recency`
next to them, and opening reads the blocks back in that order.

Config: `capacity_bytes`, `threads` (2), `loads_first` (true), `eviction_policy`
("lru"), `root_dir` (none: memory only), `bugs` (a list of names from `BUGS`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtiers import FailureReason, JobResult, LookupResult, SecondaryTier, TierContext
from kvtiers.contract.jobs import TransferJob
from kvtiers.contract.keys import BlockKey, key_hash
from kvtiers.contract.stats import StatsRecorder, TierStats
from kvtiers.sdk.integrity import checksum

BUGS = {
    "no_pin": "a load does not pin its blocks: a store may evict them before it reads",
    "hit_early": "a store's keys answer HIT once room is reserved, before the copy",
    "evict_own": "a store commits block by block, evicting whatever is oldest, its own too",
    "no_touch": "touch does nothing",
    "load_no_refresh": "a load neither pins (which refreshes, under LRU) nor touches",
    "report_early": "a job is reported (all ok) before its I/O runs",
    "report_again": "close reports every job again, as closed",
    "blocking_lookup": "the lock lookup takes is held while bytes are copied",
    "half_ok": "a short stored copy is copied as far as it goes and claimed ok",
    "no_write_stats": "stores are not counted in stats",
    "no_eviction_count": "evictions are not counted in stats",
    "no_deadline": "deadlines are ignored",
    "slot_error_ok": "a store whose slot raises reports the key ok",
    "ignore_group": "keys are indexed without their KV-group index",
    "keep_evicted": "an evicted block leaves the index, but its file stays (root_dir)",
    "keep_damaged": "a copy dropped as damaged leaves the index, its file stays (root_dir)",
    "forget_recency": "the recency saved at close is the order of stores (root_dir)",
}


@dataclass(slots=True, eq=False)
class _Block:
    data: bytes | None  # None: room reserved, bytes not copied yet (hit_early only)
    digest: int


@dataclass(slots=True)
class _Queued:
    job: TransferJob
    load: bool
    pinned: list[BlockKey]


class ToyTier(SecondaryTier):
    verifies = True

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        super().__init__(ctx, dict(config))
        self.bugs = frozenset(config.get("bugs", ()))
        if self.bugs - set(BUGS):
            raise ValueError(f"unknown bugs {sorted(self.bugs - set(BUGS))}")
        self.capacity = int(config["capacity_bytes"]) // ctx.block_bytes
        self._loads_first = bool(config.get("loads_first", True))
        self._policy = ctx.make_policy(config.get("eviction_policy", "lru"),
                                       max(1, self.capacity))
        self._stats = StatsRecorder(capacity_bytes=self.capacity * ctx.block_bytes)
        self._lock = threading.Condition()
        self._blocks: dict[bytes, _Block] = {}
        self._pins: dict[bytes, int] = {}
        self._reserved = 0
        self._loads: deque[_Queued] = deque()
        self._stores: deque[_Queued] = deque()
        self._finished: list[JobResult] = []
        self._reported: list[JobResult] = []
        self._active = 0
        self._closed = False
        root = config.get("root_dir")
        self._dir = None if root is None else Path(root) / ctx.namespace.fingerprint
        self.persistent = self._dir is not None
        self._ticks = itertools.count()
        self._stored_at: dict[bytes, int] = {}  # when each block was stored
        self._used_at: dict[bytes, int] = {}  # when each block was last stored or used
        if self._dir is not None:
            self._read_back(self._dir)
        self._threads = [
            threading.Thread(target=self._work, name=f"toy-tier-{i}", daemon=True)
            for i in range(int(config.get("threads", 2)))
        ]
        for thread in self._threads:
            thread.start()

    def _k(self, key: BlockKey) -> bytes:
        return key_hash(key) if "ignore_group" in self.bugs else key

    # Scheduler side.

    def lookup(self, key: BlockKey) -> LookupResult:
        with self._lock:
            hit = not self._closed and self._k(key) in self._blocks
        self._stats.lookup(hit)
        return LookupResult.HIT if hit else LookupResult.MISS

    def submit_store(self, job: TransferJob) -> None:
        self._submit(_Queued(job, False, []))

    def submit_load(self, job: TransferJob) -> None:
        with self._lock:
            unpinned = {"no_pin", "load_no_refresh"} & self.bugs
            pinned = [] if unpinned or self._closed else [
                k for k in map(self._k, job.keys) if k in self._blocks]
            for key in pinned:
                self._pin(key)
        self._submit(_Queued(job, True, pinned))

    def _submit(self, item: _Queued) -> None:
        with self._lock:
            if self._closed:
                self._finish(JobResult.all_failed(item.job, FailureReason.CLOSED), item.load)
                return
            (self._loads if item.load else self._stores).append(item)
            self._active += 1
            self._lock.notify_all()

    def touch(self, keys: Iterable[BlockKey]) -> None:
        if "no_touch" in self.bugs:
            return
        with self._lock:
            for key in map(self._k, keys):
                if key in self._blocks:
                    self._use(key)

    def get_finished_jobs(self) -> list[JobResult]:
        with self._lock:
            done, self._finished = self._finished, []
        return done

    def drain(self, timeout: float | None = None) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self._active == 0, timeout)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            cancelled = [*self._loads, *self._stores]
            self._loads.clear()
            self._stores.clear()
            for item in cancelled:
                self._unpin(item.pinned)
                self._finish(JobResult.all_failed(item.job, FailureReason.CLOSED), item.load)
                self._active -= 1
            self._lock.notify_all()
        for thread in self._threads:
            thread.join()
        if self._dir is not None:
            stamps = self._stored_at if "forget_recency" in self.bugs else self._used_at
            held = [k for k, block in self._blocks.items() if block.data is not None]
            order = sorted(held, key=stamps.__getitem__)
            (self._dir / "recency").write_text("".join(f"{k.hex()}\n" for k in order))
        if "report_again" in self.bugs:
            with self._lock:
                self._finished += [JobResult(r.job_id, [], dict.fromkeys(
                    [*r.ok, *r.failed], FailureReason.CLOSED)) for r in self._reported]

    def stats(self) -> TierStats:
        with self._lock:
            usage = sum(1 for b in self._blocks.values() if b.data is not None)
        return self._stats.snapshot(usage_bytes=usage * self.ctx.block_bytes)

    # Test hooks.

    def damage(self, key: BlockKey) -> None:
        with self._lock:
            block = self._blocks[self._k(key)]
            assert block.data is not None
            data = bytearray(block.data)
            data[len(data) // 2] ^= 0xFF
            block.data = bytes(data)

    def cut(self, key: BlockKey) -> None:
        with self._lock:
            block = self._blocks[self._k(key)]
            assert block.data is not None
            block.data = block.data[: len(block.data) // 2]

    # Persistence (root_dir).

    def _read_back(self, where: Path) -> None:
        """The blocks a previous instance left, least recently used first."""
        (where / "blocks").mkdir(parents=True, exist_ok=True)
        recency = where / "recency"
        names = recency.read_text().split() if recency.exists() else []
        for name in names:
            path = where / "blocks" / name
            if path.exists():
                data = path.read_bytes()
                k = bytes.fromhex(name)
                self._blocks[k] = _Block(data, checksum(data))
                self._policy.insert(k)
                self._stored_at[k] = self._used_at[k] = next(self._ticks)

    def _file(self, key: bytes) -> Path | None:
        return None if self._dir is None else self._dir / "blocks" / key.hex()

    # Under the lock.

    def _commit(self, key: bytes, data: bytes) -> None:
        path = self._file(key)
        if path is not None:
            path.write_bytes(data)
        self._blocks[key] = _Block(data, checksum(data))
        self._policy.insert(key)
        self._stored_at[key] = self._used_at[key] = next(self._ticks)

    def _use(self, key: bytes) -> None:
        self._policy.touch(key)
        self._used_at[key] = next(self._ticks)

    def _forget(self, key: bytes, *, evicted: bool) -> None:
        """`key` left the index: its file goes too (unless a bug keeps it)."""
        self._stored_at.pop(key, None)
        self._used_at.pop(key, None)
        path = self._file(key)
        kept = "keep_evicted" if evicted else "keep_damaged"
        if path is not None and kept not in self.bugs:
            path.unlink(missing_ok=True)

    def _finish(self, result: JobResult, load: bool) -> None:
        if load or "no_write_stats" not in self.bugs:
            self._stats.job(result, load=load)
        self._finished.append(result)
        self._reported.append(result)
        self._lock.notify_all()

    def _pin(self, key: bytes) -> None:
        self._pins[key] = self._pins.get(key, 0) + 1
        if self._pins[key] == 1:
            self._policy.pin(key)

    def _unpin(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._pins[key] -= 1
            if self._pins[key] == 0:
                del self._pins[key]
                if key in self._blocks:
                    self._policy.unpin(key)

    def _make_room(self) -> bool:
        """Room for one more block (reservations counted), evicting if needed."""
        while len(self._blocks) + self._reserved >= self.capacity:
            victims = self._policy.evict(1)
            if not victims:
                return False
            victim: bytes = victims[0]  # type: ignore[assignment]
            del self._blocks[victim]
            self._forget(victim, evicted=True)
            if "no_eviction_count" not in self.bugs:
                self._stats.evicted()
        return True

    def _drop(self, key: bytes, block: _Block) -> None:
        if self._blocks.get(key) is block:
            del self._blocks[key]
            self._policy.remove(key)
            self._forget(key, evicted=False)

    # I/O threads.

    def _work(self) -> None:
        while True:
            with self._lock:
                first, second = ((self._loads, self._stores) if self._loads_first
                                 else (self._stores, self._loads))
                while not (first or second or self._closed):
                    self._lock.wait()
                if not (first or second):
                    return
                item = (first or second).popleft()
                if "report_early" in self.bugs:
                    self._finish(JobResult(item.job.job_id, list(item.job.keys)), item.load)
            result = self._run(item)
            with self._lock:
                if "report_early" not in self.bugs:
                    self._finish(result, item.load)
                self._active -= 1
                self._lock.notify_all()

    def _run(self, item: _Queued) -> JobResult:
        job = item.job
        if ("no_deadline" not in self.bugs and job.deadline is not None
                and self.ctx.clock() > job.deadline):
            with self._lock:
                self._unpin(item.pinned)
            return JobResult.all_failed(job, FailureReason.TIMEOUT)
        start = time.perf_counter()
        result = self._load(job, item.pinned) if item.load else self._store(job)
        result.seconds = time.perf_counter() - start
        return result

    def _copy_in(self, slot: int) -> bytes:
        if "blocking_lookup" in self.bugs:
            with self._lock:
                return bytes(self.ctx.pool.block(slot))
        return bytes(self.ctx.pool.block(slot))

    def _store(self, job: TransferJob) -> JobResult:
        if "evict_own" in self.bugs:
            return self._store_evicting_own(job)
        result = JobResult(job.job_id)
        todo: list[tuple[BlockKey, bytes, int]] = []
        with self._lock:
            present = [k for k in map(self._k, job.keys) if k in self._blocks]
            for key in present:  # the job's own: never a victim while it runs
                self._use(key)
                self._pin(key)
            for key, slot in zip(job.keys, job.slots, strict=True):
                k = self._k(key)
                if k in self._blocks:
                    result.ok.append(key)
                elif self._make_room():
                    self._reserved += 1
                    todo.append((key, k, slot))
                    if "hit_early" in self.bugs:
                        self._blocks[k] = _Block(None, 0)
                else:
                    result.failed[key] = FailureReason.FULL
        copies: list[tuple[BlockKey, bytes, bytes]] = []
        for key, k, slot in todo:
            try:
                copies.append((key, k, self._copy_in(slot)))
            except Exception:  # noqa: BLE001 - a bad slot costs its key
                if "slot_error_ok" in self.bugs:
                    result.ok.append(key)
                else:
                    result.failed[key] = FailureReason.IO
        with self._lock:
            self._reserved -= len(todo)
            for key, k, data in copies:
                block = self._blocks.get(k)
                if block is None or block.data is None:
                    self._commit(k, data)
                result.ok.append(key)
            for _, k, _ in todo:  # hit_early: placeholders of failed copies go
                block = self._blocks.get(k)
                if block is not None and block.data is None:
                    del self._blocks[k]
            self._unpin(present)
        result.bytes_moved = len(copies) * self.ctx.block_bytes
        return result

    def _store_evicting_own(self, job: TransferJob) -> JobResult:
        result = JobResult(job.job_id)
        for key, slot in zip(job.keys, job.slots, strict=True):
            k = self._k(key)
            with self._lock:
                if k in self._blocks:
                    result.ok.append(key)
                    continue
            data = self._copy_in(slot)
            with self._lock:
                if not self._make_room():
                    result.failed[key] = FailureReason.FULL
                    continue
                self._commit(k, data)
            result.ok.append(key)
            result.bytes_moved += len(data)
        return result

    def _load(self, job: TransferJob, pinned: Sequence[bytes]) -> JobResult:
        result = JobResult(job.job_id)
        bb = self.ctx.block_bytes
        for key, slot in zip(job.keys, job.slots, strict=True):
            k = self._k(key)
            try:
                dst = self.ctx.pool.block(slot)
            except Exception:  # noqa: BLE001 - a bad slot costs its key
                result.failed[key] = FailureReason.IO
                continue
            with self._lock:  # looked up only now: what keeps it here is the pin
                block = self._blocks.get(k)
            data = None if block is None else block.data
            if block is None or data is None:
                result.failed[key] = FailureReason.MISSING
                continue
            if len(data) != bb and "half_ok" in self.bugs:
                dst[: len(data)] = data
                result.ok.append(key)
                continue
            if len(data) == bb:
                dst[:] = data
            if len(data) != bb or checksum(dst) != block.digest:
                with self._lock:
                    self._drop(k, block)
                result.failed[key] = FailureReason.CORRUPT
                continue
            result.ok.append(key)
        with self._lock:
            self._unpin(pinned)
            if "load_no_refresh" not in self.bugs:
                for key in map(self._k, result.ok):
                    if key in self._blocks:
                        self._use(key)
        result.bytes_moved = len(result.ok) * bb
        return result
