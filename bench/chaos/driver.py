"""A tier driven job by job through its public API, every loaded byte compared.

`open_tier` builds a tier from a config section the way the manager does (the
config loader validates it, `create_tier` builds it) over a fresh pool, on the real
clock, with removal events on: the driver then knows which blocks the tier gave up
by policy and which it lost. `Driver` stores random blocks and loads them back,
timing each job from submit to result. It runs in one thread and blocks on each
job (at most `timeout_s`, after which the job counts as hung and the scenario
fails). Each call it makes on the scheduler's side of the tier (`lookup` of every
key it loads, `submit_store`, `submit_load`, `get_finished_jobs`) is timed on its
own: the longest is the row's `scheduler_stall_s`, which shows a tier that blocks
the scheduler thread (those calls must never wait for I/O)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterable, Sequence
from typing import Any

from kvtiers import load_config
from kvtiers.sdk import (
    BlockKey,
    FailureReason,
    JobResult,
    SecondaryTier,
    create_tier,
    monotonic,
)
from kvtiers.testing import JobTracker, make_context, make_namespace, random_keys

from bench.chaos.report import Row

__all__ = ["Driver", "block_data", "open_tier"]


def open_tier(section: dict[str, Any], model: str, block_bytes: int,
              slots: int = 32) -> SecondaryTier:
    """The tier `section` ({"type": ..., options}) for `model`, over a pool of
    `slots` blocks of `block_bytes`."""
    config = load_config({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [section]})
    ctx = make_context(block_bytes, slots, namespace=make_namespace(model, block_bytes),
                       clock=monotonic, name=section["type"])
    ctx.events.enable()
    return create_tier(config.secondary_tiers[0], ctx)


def block_data(key: BlockKey, nbytes: int) -> bytes:
    """Random bytes that any process derives from the key alone (never zeros)."""
    return random.Random(bytes(key)).randbytes(nbytes)


def differing(a: bytes, b: bytes) -> int:
    """How many bytes differ (a length difference counts as that many)."""
    return sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))


class _Timed:
    """`tier` with its scheduler-side calls timed; the longest goes to `row`. Every
    other attribute is the tier's own."""

    def __init__(self, tier: SecondaryTier, row: Row):
        self._tier = tier
        self._row = row

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tier, name)

    def _timed(self, name: str, *args: Any) -> Any:
        start = time.monotonic()
        try:
            return getattr(self._tier, name)(*args)
        finally:
            took = time.monotonic() - start
            if took > self._row.scheduler_stall_s:
                self._row.scheduler_stall_s = took
                self._row.scheduler_stall_call = name

    def lookup(self, key: BlockKey) -> Any:
        return self._timed("lookup", key)

    def submit_store(self, job: Any) -> None:
        self._timed("submit_store", job)

    def submit_load(self, job: Any) -> None:
        self._timed("submit_load", job)

    def get_finished_jobs(self) -> list[JobResult]:
        return self._timed("get_finished_jobs")  # type: ignore[no-any-return]


class Driver:
    """Stores and loads batches of `batch` blocks through `tier`, keeping what each
    key must hold, and adds what it sees to `row`."""

    def __init__(self, tier: SecondaryTier, row: Row, batch: int = 8,
                 timeout_s: float = 120.0):
        self.tier = tier
        self.row = row
        self.batch = batch
        self.pool = tier.ctx.pool
        if self.pool.num_slots < 2 * batch:
            raise ValueError(f"a pool of {self.pool.num_slots} slots cannot hold two jobs "
                             f"of {batch} blocks")
        self.timed = _Timed(tier, row)
        self.jobs = JobTracker(self.timed, timeout_s)  # type: ignore[arg-type]
        self.stored: dict[BlockKey, bytes] = {}  # reported stored, not reported removed
        self.removed = 0

    # -- jobs -------------------------------------------------------------------------

    def _run(self, op: str, keys: Sequence[BlockKey], slots: Sequence[int]) -> JobResult:
        start = time.monotonic()
        job = self.jobs.store(keys, slots) if op == "store" else self.jobs.load(keys, slots)
        result = self.jobs.wait([job])[0]
        self.row.longest_wait_s = max(self.row.longest_wait_s, time.monotonic() - start)
        for reason in result.failed.values():
            self.row.errors[f"{op}:{FailureReason(reason).value}"] += 1
        self._take_removals()
        return result

    def store(self, keys: Sequence[BlockKey] | None = None) -> JobResult:
        """Store `keys` (default: a batch of new random keys) with `block_data`."""
        keys = list(keys) if keys is not None else random_keys(self.batch)
        slots = range(len(keys))
        datas = [block_data(k, self.pool.block_bytes) for k in keys]
        for slot, data in zip(slots, datas, strict=True):
            self.pool.block(slot)[:] = data
        result = self._run("store", keys, slots)
        for key, data in zip(keys, datas, strict=True):
            if key in result.ok:
                self.stored[key] = data
                self.row.blocks_stored += 1
        return result

    def load(self, keys: Sequence[BlockKey]) -> JobResult:
        """Load `keys` into poisoned slots and compare every byte of each one that
        loaded with what was stored for it."""
        slots = range(self.batch, self.batch + len(keys))
        for slot in slots:
            self.pool.block(slot)[:] = os.urandom(self.pool.block_bytes)
        for key in keys:  # as a scheduler does before a load (the answer is not needed)
            self.timed.lookup(key)
        result = self._run("load", keys, slots)
        for key, slot in zip(keys, slots, strict=True):
            if key in result.ok:
                want = self.stored.get(key, block_data(key, self.pool.block_bytes))
                self.row.wrong_bytes += differing(bytes(self.pool.block(slot)), want)
                self.row.blocks_checked += 1
        return result

    def _take_removals(self) -> None:
        for key in self.tier.ctx.events.take():
            if self.stored.pop(key, None) is not None:
                self.removed += 1

    # -- checks -----------------------------------------------------------------------

    def check_all(self, keys: Iterable[BlockKey] | None = None, attempts: int = 3) -> int:
        """Load every block reported stored (or `keys`) and check it. A block the
        tier answers `missing` or `corrupt` for without having reported it removed
        counts as lost; one that fails otherwise (`io`, `timeout`) is asked again, up
        to `attempts` times, then counted lost too. Returns how many were lost (also
        added to the row)."""
        explicit = keys is not None
        wanted = list(self.stored if keys is None else keys)
        lost = 0
        for i in range(0, len(wanted), self.batch):
            chunk = wanted[i:i + self.batch]
            for attempt in range(attempts):
                result = self.load(chunk)
                self._take_removals()
                gone = {k: r for k, r in result.failed.items()
                        if explicit or k in self.stored}
                final = {k: r for k, r in gone.items()
                         if r in (FailureReason.MISSING, FailureReason.CORRUPT)
                         or attempt == attempts - 1}
                for key, reason in final.items():
                    lost += 1
                    self.row.notes.append(f"block {key.hex()[:16]} not served: "
                                          f"{FailureReason(reason).value}")
                chunk = [k for k in gone if k not in final]
                if not chunk:
                    break
        self.row.lost_blocks += lost
        return lost
