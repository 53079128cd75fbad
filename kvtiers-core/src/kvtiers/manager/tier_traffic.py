"""The manager's traffic with its secondary tiers: collecting finished jobs, timing
out late ones, submitting the step's promotions and cascades, and draining.

A mixin of `TieringOffloadingManager`, kept apart because it is the one part that
talks to tiers; it uses the manager's pool state (`_hold`, `_release`,
`_drop_reserved`, `_free_slot`, the slot state arrays) and nothing else of it.
Runs on the scheduler's thread like the rest of the manager.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kvtiers.jobs import FailureReason, JobResult, TransferJob
from kvtiers.keys import BlockKey
from kvtiers.manager.events import OffloadEvent
from kvtiers.manager.slot_state import QUARANTINED, READY
from kvtiers.manager.tier_runtime import TierRuntime

_log = logging.getLogger("kvtiers.manager")

# Failure reasons that say something about a tier's health (for the breaker).
_UNHEALTHY = {FailureReason.IO, FailureReason.TIMEOUT, FailureReason.CLOSED}


@dataclass
class _Job:
    kind: str  # "promote" | "cascade"
    tier: TierRuntime
    keys: list[BlockKey]
    slots: list[int]
    deadline: float
    timed_out: bool = False


class TierTraffic:
    """Mixin: see the module docstring."""

    # ------------------------------------------------------------------ step

    def step(self) -> None:
        """Collect finished tier jobs, time out late ones, submit queued promotions
        and cascades. Call once per scheduler step."""
        with self._lock:
            for rt in self._tiers:
                try:
                    results = rt.tier.get_finished_jobs()
                except Exception:  # noqa: BLE001
                    _log.exception("tier %s: get_finished_jobs raised", rt.name)
                    rt.breaker.failure()
                    continue
                for result in results:
                    self._finish(result)
            self._expire()
            for rt in self._tiers:
                self._submit_promotions(rt)
                self._submit_cascades(rt)

    def _finish(self, result: JobResult) -> None:
        job = self._jobs.pop(result.job_id, None)
        if job is None:
            _log.warning("unknown job %d reported; ignored", result.job_id)
            return
        rt = job.tier
        if job.timed_out:
            # Late report of a job already counted as failed: its slots may be reused now.
            self._settle_timed_out(job)
            return
        reasons = result.reasons()
        if any(r in _UNHEALTHY for r in reasons):
            rt.breaker.failure()
        else:
            rt.breaker.success()
        rt.counters.count_errors(dict(reasons))
        if job.kind == "promote":
            self._land_promotion(job, result)
        else:
            self._end_cascade(job, result)

    def _land_promotion(self, job: _Job, result: JobResult) -> None:
        failed = result.failed
        ok = set(result.ok)
        state = self._state
        landed: list[BlockKey] = []
        for key, slot in zip(job.keys, job.slots):
            if key in failed or key not in ok:  # a key the tier did not report ok
                job.tier.counters.promotion_failures += 1
                self._drop_reserved(key, slot)
            else:
                state[slot] = READY
                self._release(key, slot)
                landed.append(key)
        job.tier.counters.promoted_hits += len(landed)
        if landed:
            self._events.append(OffloadEvent("stored", landed))

    def _end_cascade(self, job: _Job, result: JobResult) -> None:
        rt = job.tier
        rt.inflight_cascade_blocks -= len(job.keys)
        ok = len(job.keys) - len(result.failed)
        rt.counters.cascaded_blocks += ok
        rt.counters.cascade_failures += len(result.failed)
        for key, slot in zip(job.keys, job.slots):
            self._release(key, slot)

    def _expire(self) -> None:
        now = self._clock()
        for job in self._jobs.values():
            if job.timed_out or job.deadline > now:
                continue
            job.timed_out = True
            rt = job.tier
            rt.stuck_blocks += len(job.keys)
            rt.counters.timeouts += 1
            rt.counters.count_errors({FailureReason.TIMEOUT: len(job.keys)})
            rt.breaker.failure()
            if job.kind == "promote":
                # The key becomes a miss now; the slot stays quarantined until the
                # tier reports, because a stuck read may still land in it.
                for key, slot in zip(job.keys, job.slots):
                    self._policy.remove(key)
                    if self._holds[slot]:
                        self._pinned -= 1
                    self._holds[slot] = 0
                    self._state[slot] = QUARANTINED
                    self._flags[slot] = 0
            # A timed-out cascade keeps its holds: the tier may still be reading the
            # slots, so they must not be reused until it reports.
            else:
                rt.inflight_cascade_blocks -= len(job.keys)
                rt.counters.cascade_failures += len(job.keys)

    def _settle_timed_out(self, job: _Job) -> None:
        job.tier.stuck_blocks -= len(job.keys)
        if job.kind == "promote":
            for slot in job.slots:
                if self._state[slot] == QUARANTINED:
                    self._free_slot(slot)
        else:
            for key, slot in zip(job.keys, job.slots):
                self._release(key, slot)

    def _submit_promotions(self, rt: TierRuntime) -> None:
        pending = rt.promotions
        if not pending:
            return
        rt.promotions = []
        for i in range(0, len(pending), self._max_job):
            chunk = pending[i : i + self._max_job]
            job = self._new_job("promote", rt, chunk)
            try:
                rt.tier.submit_load(job)
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: submit_load raised", rt.name)
                self._jobs.pop(job.job_id)
                rt.breaker.failure()
                for key, slot in chunk:
                    rt.counters.promotion_failures += 1
                    self._drop_reserved(key, slot)

    def _submit_cascades(self, rt: TierRuntime) -> None:
        queue = rt.queue
        if not queue:
            return
        if not rt.breaker.allows():
            return
        while queue and rt.inflight_cascade_blocks + rt.stuck_blocks < self._max_inflight:
            room = self._max_inflight - rt.inflight_cascade_blocks - rt.stuck_blocks
            n = min(len(queue), self._max_job, room)
            chunk = [queue.popleft() for _ in range(n)]
            job = self._new_job("cascade", rt, chunk)
            rt.inflight_cascade_blocks += n
            try:
                rt.tier.submit_store(job)
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: submit_store raised", rt.name)
                self._jobs.pop(job.job_id)
                rt.breaker.failure()
                rt.inflight_cascade_blocks -= n
                rt.counters.cascade_failures += n
                for key, slot in chunk:
                    self._release(key, slot)
                return

    def _new_job(self, kind: str, rt: TierRuntime, items: list[tuple[BlockKey, int]]) -> TransferJob:
        job_id = self._next_job_id
        self._next_job_id += 1
        keys = [k for k, _ in items]
        slots = [s for _, s in items]
        deadline = self._clock() + self._timeout
        self._jobs[job_id] = _Job(kind, rt, keys, slots, deadline)
        return TransferJob(job_id, keys, slots, deadline)

    def _queue_cascade(self, rt: TierRuntime, key: BlockKey, slot: int) -> bool:
        """Queue a copy of the block to `rt` (taking a hold), or drop and count it
        when the tier's queued plus running cascades reach its bound or it is down."""
        busy = len(rt.queue) + rt.inflight_cascade_blocks + rt.stuck_blocks
        if busy >= rt.queue_limit or not rt.breaker.allows():
            rt.counters.cascades_dropped += 1
            return False
        rt.queue.append((key, slot))
        self._hold(key, slot)
        return True

    def drain(self, timeout: float | None = None) -> bool:
        """Submit everything queued and wait for the tiers' jobs (shutdown, tests).
        False when `timeout` passed or the tiers stopped making progress (a tier
        that never reports, a breaker holding cascades back). Never holds the lock
        while it waits: a peer-serving tier's threads may need the manager."""
        end = None if timeout is None else time.monotonic() + timeout
        self.step()
        while True:
            with self._lock:
                if not self._jobs and not any(rt.queue or rt.promotions for rt in self._tiers):
                    return True
                before = (set(self._jobs), [len(rt.queue) for rt in self._tiers])
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            for rt in self._tiers:
                try:
                    rt.tier.drain(left)
                except Exception:  # noqa: BLE001
                    _log.exception("tier %s: drain raised", rt.name)
            self.step()
            with self._lock:
                if (set(self._jobs), [len(rt.queue) for rt in self._tiers]) == before:
                    return False
