"""The `faulty` tier: wraps any tier and injects errors, misses, latency, hangs and
corruption, reproducibly, so failure handling is tested without broken hardware.

Every draw happens on the caller's thread, at `lookup`/`submit_*` time, from
per-fault-kind streams derived from `seed`; the same seed and the same sequence of
calls give the same faults whatever the threads do, and enabling one kind of fault
does not change the pattern of another. With every rate at 0 (the defaults) the
tier forwards everything untouched and passes the conformance suite like its inner.

Time is the tier's clock (`TierContext.clock`): held jobs (latency, hangs) are
released or timed out when `get_finished_jobs` or `drain` looks at the clock, so a
`ManualClock` drives them without sleeping. A job whose deadline passes while held
fails with `timeout` for all its keys and is never forwarded: its slots are never
touched afterwards.

Corruption is applied to the pool slot after the inner tier reported the load ok
(one byte flipped); the inner tier's own copy stays intact, so unlike a real
`corrupt` report the key is not dropped and a later load of it may succeed.

Capability flags. They describe the inner tier, which is only known once built, so
the class says False for each (what the registry sees before construction) and each
instance sets its own to the inner's: `persistent`, `shared` and `serves_peers` are
the inner's; `verifies` is the inner's unless corruption is injected undetected
(`corrupt_rate > 0` and `corrupt_detected: false`), which makes the wrapper a tier
that serves wrong bytes. Read flags from the instance, as the conformance suite does.

Injected faults are counted in `faults` ("error" and "corrupt" per key, "miss" per
lookup, "hang" and "timeout" per job) and appear in `stats().errors` through the
results this tier reports; usage, capacity and evictions are the inner's.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers.config.options import resolve_options
from kvtiers.contract.jobs import FailureReason, JobResult, TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.parent import ParentManager
from kvtiers.contract.stats import StatsRecorder, TierStats
from kvtiers.contract.tier import SecondaryTier, TierContext
from kvtiers.tiers.schemas import FAULTY_SCHEMA

_DRAIN_POLL_S = 0.002  # real-time wait between looks at the clock while jobs are held


@dataclass(slots=True, eq=False)
class _Plan:
    """The faults drawn for one submitted job, and where it stands."""

    job: TransferJob
    load: bool
    release_at: float  # clock time it is forwarded; inf: hung forever
    injected: dict[BlockKey, FailureReason]  # keys failed without forwarding
    corrupt: dict[BlockKey, tuple[int, int]]  # key -> (slot, byte offset) to flip
    forward: TransferJob | None  # what the inner tier gets (None: nothing)


class FaultyTier(SecondaryTier):
    """A tier that forwards to `inner` and injects the configured faults."""

    # Unknown until the inner tier is built; each instance sets its own (see module doc).
    persistent = False
    shared = False
    serves_peers = False
    verifies = False

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        options = resolve_options(FAULTY_SCHEMA, config, "faulty")
        super().__init__(ctx, options)
        self.inner: SecondaryTier = _build_inner(options["inner"], ctx)
        self._error_rate: float = options["error_rate"]
        self._miss_rate: float = options["miss_rate"]
        self._latency_s: float = options["latency_s"]
        self._hang_rate: float = options["hang_rate"]
        self._hang_s: float = math.inf if options["hang_s"] is None else options["hang_s"]
        self._corrupt_rate: float = options["corrupt_rate"]
        self._corrupt_detected: bool = options["corrupt_detected"]
        self._ops = frozenset(options["ops"])
        seed = options["seed"]
        self._rng = {
            kind: random.Random(f"kvtiers-faulty/{seed}/{kind}")
            for kind in ("error", "miss", "hang", "corrupt")
        }
        self.faults: Counter[str] = Counter()
        self._stats = StatsRecorder()
        self._lock = threading.Lock()
        self._held: list[_Plan] = []
        self._forwarded: dict[int, _Plan] = {}
        self._ready: list[JobResult] = []
        self._closed = False
        inner = self.inner
        flags = {
            "persistent": inner.persistent,
            "shared": inner.shared,
            "serves_peers": inner.serves_peers,
            "verifies": inner.verifies
            and (self._corrupt_detected or not self._corrupt_rate or "load" not in self._ops),
        }
        for flag, value in flags.items():
            # Instance attributes shadow the class defaults on purpose (see module doc).
            setattr(self, flag, value)

    @classmethod
    def wrap(cls, inner: SecondaryTier, **faults: Any) -> FaultyTier:
        """Wrap an already built tier (which the wrapper then owns and closes)."""
        return cls(inner.ctx, {"inner": inner, **faults})

    # Lookups.

    def lookup(self, key: BlockKey) -> LookupResult:
        if self._injects_miss():
            return LookupResult.MISS
        return self._counted(self.inner.lookup(key))

    def lookup_in_request(self, key: BlockKey, request_id: str) -> LookupResult:
        """As `lookup` (the same miss draws), the inner's answer for the request."""
        if self._injects_miss():
            return LookupResult.MISS
        return self._counted(self.inner.lookup_in_request(key, request_id))

    def answers_in_request(self) -> bool:
        return self.inner.answers_in_request()

    def _injects_miss(self) -> bool:
        if (
            self._miss_rate
            and "lookup" in self._ops
            and self._rng["miss"].random() < self._miss_rate
        ):
            self.faults["miss"] += 1
            self._stats.lookup(False)
            return True
        return False

    def _counted(self, answer: LookupResult) -> LookupResult:
        if answer is not LookupResult.RETRY:
            self._stats.lookup(answer is LookupResult.HIT)
        return answer

    # Jobs.

    def submit_store(self, job: TransferJob) -> None:
        self._submit(job, load=False)

    def submit_load(self, job: TransferJob) -> None:
        self._submit(job, load=True)

    def _submit(self, job: TransferJob, load: bool) -> None:
        now = self.ctx.clock()
        with self._lock:
            if self._closed:
                self._emit(JobResult.all_failed(job, FailureReason.CLOSED), load)
                return
            plan = self._plan(job, load, now)
            if plan.release_at <= now:
                self._release(plan)
            else:
                self._held.append(plan)

    def _plan(self, job: TransferJob, load: bool, now: float) -> _Plan:
        if ("load" if load else "store") not in self._ops:
            return _Plan(job, load, now, {}, {}, job)
        release_at = now + self._latency_s
        if self._hang_rate and self._rng["hang"].random() < self._hang_rate:
            self.faults["hang"] += 1
            release_at += self._hang_s
        injected: dict[BlockKey, FailureReason] = {}
        if self._error_rate:
            draw = self._rng["error"].random
            injected = {k: FailureReason.IO for k in job.keys if draw() < self._error_rate}
            self.faults["error"] += len(injected)
        corrupt: dict[BlockKey, tuple[int, int]] = {}
        if load and self._corrupt_rate:
            rng, size = self._rng["corrupt"], self.ctx.block_bytes
            for key, slot in zip(job.keys, job.slots, strict=True):
                if rng.random() < self._corrupt_rate:
                    corrupt[key] = (slot, rng.randrange(size))
        if not injected:
            forward: TransferJob | None = job
        elif len(injected) == len(job.keys):
            forward = None
        else:
            pairs = zip(job.keys, job.slots, strict=True)
            kept = [(k, s) for k, s in pairs if k not in injected]
            forward = TransferJob(
                job.job_id, [k for k, _ in kept], [s for _, s in kept], job.deadline
            )
        return _Plan(job, load, release_at, injected, corrupt, forward)

    def _release(self, plan: _Plan) -> None:
        """Forward a plan's job to the inner tier (or finish it: nothing to forward)."""
        if plan.forward is None:
            self._emit(JobResult(plan.job.job_id, [], dict(plan.injected)), plan.load)
            return
        self._forwarded[plan.job.job_id] = plan
        if plan.load:
            self.inner.submit_load(plan.forward)
        else:
            self.inner.submit_store(plan.forward)

    def _pump(self, now: float) -> None:
        """Release held jobs that are due; time out those past their deadline."""
        if not self._held:
            return
        keep: list[_Plan] = []
        for plan in self._held:
            deadline = plan.job.deadline
            if deadline is not None and now > deadline:
                self.faults["timeout"] += 1
                self._emit(JobResult.all_failed(plan.job, FailureReason.TIMEOUT), plan.load)
            elif now >= plan.release_at:
                self._release(plan)
            else:
                keep.append(plan)
        self._held = keep

    def _merge(self, plan: _Plan, result: JobResult) -> JobResult:
        """The inner's result for a forwarded job, plus the faults drawn for it."""
        result.failed.update(plan.injected)
        if plan.corrupt:
            pool, ok = self.ctx.pool, []
            for key in result.ok:
                spot = plan.corrupt.get(key)
                if spot is None:
                    ok.append(key)
                    continue
                slot, offset = spot
                pool.block(slot)[offset] ^= 0xFF
                self.faults["corrupt"] += 1
                if self._corrupt_detected:
                    result.failed[key] = FailureReason.CORRUPT
                    result.bytes_moved = max(0, result.bytes_moved - self.ctx.block_bytes)
                else:
                    ok.append(key)
            result.ok = ok
        return result

    def _emit(self, result: JobResult, load: bool) -> None:
        self._stats.job(result, load=load)
        self._ready.append(result)

    def get_finished_jobs(self) -> list[JobResult]:
        with self._lock:
            self._pump(self.ctx.clock())
            for result in self.inner.get_finished_jobs():
                plan = self._forwarded.pop(result.job_id, None)
                if plan is None:  # not ours: pass it on as is
                    self._ready.append(result)
                else:
                    self._emit(self._merge(plan, result), plan.load)
            done, self._ready = self._ready, []
        return done

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no job is held or running in the inner tier. Held jobs end only
        when the clock passes their release time or deadline: with a `ManualClock`
        nobody advances, this returns False at `timeout` (or never, without one)."""
        end = None if timeout is None else time.monotonic() + timeout
        idle = threading.Event()  # never set: a bounded wait, not a signal
        while True:
            with self._lock:
                self._pump(self.ctx.clock())
                held = bool(self._held)
            left = None if end is None else max(0.0, end - time.monotonic())
            if not held:
                return self.inner.drain(left)
            if left == 0.0:
                return False
            idle.wait(_DRAIN_POLL_S if left is None else min(_DRAIN_POLL_S, left))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for plan in self._held:  # never forwarded: no I/O ever touched their slots
                self._emit(JobResult.all_failed(plan.job, FailureReason.CLOSED), plan.load)
            self._held = []
        self.inner.close()

    def stats(self) -> TierStats:
        inner = self.inner.stats()
        out = self._stats.snapshot(usage_bytes=inner.usage_bytes)
        out.capacity_bytes = inner.capacity_bytes
        out.evictions = inner.evictions
        return out

    # Optional parts, forwarded.

    def touch(self, keys: Iterable[BlockKey]) -> None:
        self.inner.touch(keys)

    def on_request_start(self, request_id: str, params: Mapping[str, Any] | None = None) -> None:
        self.inner.on_request_start(request_id, params)

    def on_request_finished(self, request_id: str) -> None:
        self.inner.on_request_finished(request_id)

    def serve_external_requests(self, parent: ParentManager) -> None:
        self.inner.serve_external_requests(parent)


def _build_inner(spec: Any, ctx: TierContext) -> SecondaryTier:
    """The inner tier from a `TierSection` (loaded config), a plain mapping with a
    "type" (a section written in Python), or an already built tier."""
    if isinstance(spec, SecondaryTier):
        return spec
    return ctx.build_tier(spec, suffix="inner")
