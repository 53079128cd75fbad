"""`TierTraffic`: the manager's traffic with its secondary tiers.

It owns, per tier, a `TierRuntime` (breaker, bounded cascade queue, the step's
promotions, counters) and the table of jobs given to tiers. It finds blocks in the
tiers (a HIT reserves a pool slot through the `SlotTable` and starts a promotion),
queues cascades, and in `step()` collects finished jobs, times out late ones and
submits the step's promotions and cascades, one job per tier and chunk. The pool's
state changes only through the `SlotTable`'s methods.

Scheduler thread (the manager calls it under its lock), except `drain_tiers` and
`close_tiers`, which block and are called without the lock. A tier's exception is
logged, counted against its breaker and treated as a miss or a failed job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvtiers.contract.clock import Clock
from kvtiers.contract.events import TierEvents
from kvtiers.contract.jobs import FailureReason, JobResult, TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.tier import SecondaryTier
from kvtiers.manager.breaker import CircuitBreaker
from kvtiers.manager.event_log import EventLog
from kvtiers.manager.slot_state import READY
from kvtiers.manager.slot_table import SlotTable
from kvtiers.manager.tier_runtime import TierJob, TierRuntime

if TYPE_CHECKING:
    from kvtiers.admission.base import AdmissionPolicy

_log = logging.getLogger("kvtiers.manager")

# Failure reasons that say something about a tier's health (for the breaker).
_UNHEALTHY = {FailureReason.IO, FailureReason.TIMEOUT, FailureReason.CLOSED}


def _answers_in_request(tier: SecondaryTier) -> bool:
    """Whether `tier` answers lookups per request (a tier-like object without the
    optional method: no)."""
    answers = getattr(tier, "answers_in_request", None)
    return bool(answers()) if callable(answers) else False


class TierTraffic:
    """See the module docstring. `tiers` and `jobs` may be read (stats, checks);
    `next_id()` hands out job ids shared with the manager's peer jobs."""

    def __init__(
        self,
        tiers: Sequence[SecondaryTier],
        names: Sequence[str],
        slots: SlotTable,
        events: EventLog,
        next_id: Callable[[], int],
        *,
        clock: Clock,
        job_timeout_s: float,
        queue_limit: int,
        max_job_blocks: int,
        max_inflight_cascade_blocks: int,
        breaker_failures: int,
        breaker_cooldown_s: float,
        admissions: Sequence[AdmissionPolicy | None] | None = None,
    ):
        self._slots = slots
        self._events = events
        self._next_id = next_id
        self._clock = clock
        self._timeout = job_timeout_s
        self._max_job = max_job_blocks
        self._max_inflight = max_inflight_cascade_blocks
        # Deferred copies cost no pin, only an entry: at most one per pool slot.
        self._defer_limit = slots.num_slots
        self.tiers = [
            TierRuntime(
                i, names[i], t, CircuitBreaker(clock, breaker_failures, breaker_cooldown_s),
                queue_limit, admissions[i] if admissions else None,
            )
            for i, t in enumerate(tiers)
        ]  # fmt: skip
        self.jobs: dict[int, TierJob] = {}
        #: the tiers with an admission policy (that count uses of blocks)
        self.judged = [rt for rt in self.tiers if rt.admission is not None]
        #: the indices of the tiers whose answer depends on the request asking
        #: (`SecondaryTier.answers_in_request`, asked once, here)
        self.in_request = frozenset(rt.index for rt in self.tiers
                                    if _answers_in_request(rt.tier))
        # Promotions on their way (reserved, submitted, not landed): key -> tier name.
        self._promoting: dict[BlockKey, str] = {}
        for rt in self.tiers:
            reporter = getattr(getattr(rt.tier, "ctx", None), "events", None)
            if isinstance(reporter, TierEvents):
                events.watch(rt.name, reporter)

    # ------------------------------------------------------------------ lookups

    def lookup(self, key: BlockKey, only: Container[int] | None = None,
               request_id: str | None = None) -> LookupResult:
        """Ask the tiers in order (those whose index is in `only`, if given) for a
        block the pool lacks. A HIT reserves a slot and queues its promotion for
        this step's job: HIT_PENDING. MISS also when no slot can be had.
        `request_id`: the engine request asking (None: none); the tiers of
        `in_request` are asked `lookup_in_request(key, request_id)` then."""
        retry = False
        for rt in self.tiers:
            if rt.stuck_blocks >= rt.queue_limit or not rt.breaker.allows():
                continue
            if only is not None and rt.index not in only:
                continue
            try:
                if request_id is None or rt.index not in self.in_request:
                    answer = rt.tier.lookup(key)
                else:
                    answer = rt.tier.lookup_in_request(key, request_id)
            except Exception:  # noqa: BLE001 - a tier's failure is a miss
                rt.counters.lookup_errors += 1
                _log.exception("tier %s: lookup raised; treating as a miss", rt.name)
                rt.breaker.failure()
                continue
            if answer is LookupResult.HIT:
                slot = self._slots.reserve_promotion(key, self.copy_down)
                if slot is None:
                    return LookupResult.MISS
                rt.promotions.append((key, slot))
                self._promoting[key] = rt.name
                return LookupResult.HIT_PENDING
            if answer is LookupResult.RETRY:
                retry = True
        return LookupResult.RETRY if retry else LookupResult.MISS

    def promotion_source(self, key: BlockKey) -> str | None:
        """The name of the tier promoting `key` into the pool, while it is on its way."""
        return self._promoting.get(key)

    # ------------------------------------------------------------------ cascades

    def cascade(self, key: BlockKey, slot: int) -> None:
        """Queue copies of a just-stored block to every tier (write_through). A tier
        whose queue is full gets it later: deferred, holding no pin, queued in order
        as the tier catches up if the block is still in its slot then."""
        for rt in self.tiers:
            self._queue_cascade(rt, key, slot, defer=True, remember=True)

    def used(self, key: BlockKey, slot: int) -> None:
        """A pool hit of `key`, readable at `slot`: a use of the block, which the
        admission policies count as a touch (`AdmissionPolicy.used`). A block a
        tier's policy refused when it was stored (write_through) is offered to that
        tier again now, once: its reuse is proven while it is still in the pool, and
        no later store would offer it. O(1) per tier that has a policy; only called
        when `judged` is not empty."""
        for rt in self.judged:
            rt.admission.used(key)  # type: ignore[union-attr]  # judged: has one
            if rt.refused and key in rt.refused:
                del rt.refused[key]
                self._queue_cascade(rt, key, slot, defer=True, remember=True)

    def copy_down(self, key: BlockKey, slot: int) -> bool:
        """Queue copies of a dirty victim to every tier (write_back); False when no
        tier took it (a victim leaves now: it cannot wait for room)."""
        queued = False
        for rt in self.tiers:
            if self._queue_cascade(rt, key, slot):
                queued = True
        return queued

    def _queue_cascade(self, rt: TierRuntime, key: BlockKey, slot: int, *,
                       defer: bool = False, remember: bool = False) -> bool:
        """Queue a copy of the block to `rt` (taking a hold) when its queued plus
        running cascades are below its bound; else defer it (`defer`, without a
        hold, at most `_defer_limit` of them) or drop and count it. A tier that is
        down gets nothing. `remember`: a block the admission policy refuses stays in
        the block pool (write_through), so a pool hit may offer it again. True when
        queued or deferred."""
        if not rt.breaker.allows():
            rt.counters.cascades_dropped += 1
            return False
        full = len(rt.queue) + rt.inflight_cascade_blocks + rt.stuck_blocks >= rt.queue_limit
        if full and not defer:
            rt.counters.cascades_dropped += 1
            return False
        if rt.admission is not None and not rt.admission.admit(key):  # None: admit all
            rt.counters.cascades_not_admitted += 1
            if remember:
                refused = rt.refused
                refused[key] = None
                if len(refused) > self._slots.num_slots:  # bounded: the oldest goes
                    del refused[next(iter(refused))]
            return False
        if rt.refused:  # refused once, admitted now (stored again): no second offer
            rt.refused.pop(key, None)
        if full or rt.deferred:  # behind the copies deferred before it: prefix order
            if len(rt.deferred) >= self._defer_limit:
                rt.counters.cascades_dropped += 1
                return False
            rt.deferred.append((key, slot))
            rt.counters.cascades_deferred += 1
            return True
        rt.queue.append((key, slot))
        self._slots.hold(key, slot)
        return True

    def _queue_deferred(self, rt: TierRuntime) -> None:
        """Move deferred copies into the queue while it has room (taking their
        holds). A block that left its slot or is not readable there any more was
        evicted before its turn: that copy is dropped (counted). A tier that went
        down drops them all."""
        deferred = rt.deferred
        if not rt.breaker.allows():
            rt.counters.cascades_dropped += len(deferred)
            deferred.clear()
            return
        room = rt.queue_limit - len(rt.queue) - rt.inflight_cascade_blocks - rt.stuck_blocks
        get, state, hold, queue = self._slots.get, self._slots.state, self._slots.hold, rt.queue
        while deferred and room > 0:
            key, slot = deferred.popleft()
            if get(key) != slot or state[slot] != READY:
                rt.counters.cascades_dropped += 1
                continue
            queue.append((key, slot))
            hold(key, slot)
            room -= 1

    def drop_queued(self) -> None:
        """Forget every cascade not yet submitted (their holds go)."""
        release = self._slots.release
        for rt in self.tiers:
            rt.counters.cascades_dropped += len(rt.deferred)
            rt.deferred.clear()
            while rt.queue:
                key, slot = rt.queue.popleft()
                rt.counters.cascades_dropped += 1
                release(key, slot)

    # ------------------------------------------------------------------ step

    def step(self) -> None:
        """Collect finished jobs, time out late ones, submit queued promotions and
        cascades."""
        self.collect()
        self._expire()
        for rt in self.tiers:
            self._submit_promotions(rt)
            if rt.deferred:
                self._queue_deferred(rt)
            self._submit_cascades(rt)

    def collect(self) -> None:
        """Collect the tiers' finished jobs (promotions land, copies end); nothing is
        submitted or timed out."""
        for rt in self.tiers:
            try:
                results = rt.tier.get_finished_jobs()
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: get_finished_jobs raised", rt.name)
                rt.breaker.failure()
                continue
            for result in results:
                self._finish(result)

    def _finish(self, result: JobResult) -> None:
        job = self.jobs.pop(result.job_id, None)
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

    def _land_promotion(self, job: TierJob, result: JobResult) -> None:
        failed = result.failed
        ok = set(result.ok)
        slots = self._slots
        landed: list[BlockKey] = []
        promoting = self._promoting
        for key, slot in zip(job.keys, job.slots, strict=True):
            promoting.pop(key, None)
            if key in failed or key not in ok:  # a key the tier did not report ok
                job.tier.counters.promotion_failures += 1
                slots.drop_reserved(key, slot)
            else:
                slots.land(key, slot)
                landed.append(key)
        job.tier.counters.promoted_hits += len(landed)
        self._events.stored(landed, source=job.tier.name)

    def _end_cascade(self, job: TierJob, result: JobResult) -> None:
        rt = job.tier
        rt.inflight_cascade_blocks -= len(job.keys)
        failed = result.failed
        rt.counters.cascaded_blocks += len(job.keys) - len(failed)
        rt.counters.cascade_failures += len(failed)
        if self._events.enabled:
            ok = set(result.ok)
            self._events.stored([k for k in job.keys if k in ok and k not in failed], rt.name)
        release = self._slots.release
        for key, slot in zip(job.keys, job.slots, strict=True):
            release(key, slot)

    def _expire(self) -> None:
        now = self._clock()
        for job in self.jobs.values():
            if job.timed_out or job.deadline > now:
                continue
            job.timed_out = True
            rt = job.tier
            rt.stuck_blocks += len(job.keys)
            rt.counters.timeouts += 1
            rt.counters.count_errors({FailureReason.TIMEOUT: len(job.keys)})
            rt.breaker.failure()
            if job.kind == "promote":
                for key, slot in zip(job.keys, job.slots, strict=True):
                    self._promoting.pop(key, None)
                    self._slots.quarantine(key, slot)
            # A timed-out cascade keeps its holds: the tier may still be reading the
            # slots, so they must not be reused until it reports.
            else:
                rt.inflight_cascade_blocks -= len(job.keys)
                rt.counters.cascade_failures += len(job.keys)

    def _settle_timed_out(self, job: TierJob) -> None:
        job.tier.stuck_blocks -= len(job.keys)
        if job.kind == "promote":
            for slot in job.slots:
                self._slots.free_quarantined(slot)
        else:
            for key, slot in zip(job.keys, job.slots, strict=True):
                self._slots.release(key, slot)

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
                self.jobs.pop(job.job_id)
                rt.breaker.failure()
                for key, slot in chunk:
                    rt.counters.promotion_failures += 1
                    self._promoting.pop(key, None)
                    self._slots.drop_reserved(key, slot)

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
            if len({key for key, _ in chunk}) < n:
                chunk = self._once_each(rt, chunk)
                n = len(chunk)
            job = self._new_job("cascade", rt, chunk)
            rt.inflight_cascade_blocks += n
            try:
                rt.tier.submit_store(job)
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: submit_store raised", rt.name)
                self.jobs.pop(job.job_id)
                rt.breaker.failure()
                rt.inflight_cascade_blocks -= n
                rt.counters.cascade_failures += n
                for key, slot in chunk:
                    self._slots.release(key, slot)
                return

    def _once_each(self, rt: TierRuntime,
                   chunk: list[tuple[BlockKey, int]]) -> list[tuple[BlockKey, int]]:
        """`chunk` with each key once: a deferred copy holds no pin, so its block
        can leave and come back to the same slot and be deferred again - both
        copies are of the same bytes. The repeat's hold goes; it counts as
        dropped."""
        seen: set[BlockKey] = set()
        once = []
        for key, slot in chunk:
            if key in seen:
                self._slots.release(key, slot)
                rt.counters.cascades_dropped += 1
            else:
                seen.add(key)
                once.append((key, slot))
        return once

    def _new_job(
        self, kind: str, rt: TierRuntime, items: list[tuple[BlockKey, int]]
    ) -> TransferJob:
        job_id = self._next_id()
        keys = [k for k, _ in items]
        slots = [s for _, s in items]
        deadline = self._clock() + self._timeout
        self.jobs[job_id] = TierJob(kind, rt, keys, slots, deadline)
        return TransferJob(job_id, keys, slots, deadline)

    # ------------------------------------------------------------------ idle, drain

    def idle(self) -> bool:
        """No job running, no cascade queued, no promotion waiting for the step."""
        return not self.jobs and not any(
            rt.queue or rt.promotions or rt.deferred for rt in self.tiers
        )

    def progress(self) -> tuple[set[int], list[int]]:
        """What changes when work moves on (jobs running, cascades queued)."""
        return set(self.jobs), [len(rt.queue) + len(rt.deferred) for rt in self.tiers]

    def drain_tiers(self, timeout: float | None) -> None:
        """Wait for each tier's running jobs (blocks; call without the lock)."""
        for rt in self.tiers:
            try:
                rt.tier.drain(timeout)
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: drain raised", rt.name)

    # ------------------------------------------------------------------ the rest

    def touch(self, keys: Sequence[BlockKey]) -> None:
        for rt in self.tiers:
            if not rt.breaker.allows():
                continue
            try:
                rt.tier.touch(keys)
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: touch raised", rt.name)

    def request_started(self, request_id: str, params: Mapping[str, Any] | None) -> None:
        for rt in self.tiers:
            try:
                rt.tier.on_request_start(request_id, params)
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: on_request_start raised", rt.name)

    def request_finished(self, request_id: str) -> None:
        for rt in self.tiers:
            try:
                rt.tier.on_request_finished(request_id)
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: on_request_finished raised", rt.name)

    def counters(self) -> list[tuple[TierRuntime, dict[str, Any]]]:
        """Per tier, what the manager credits it with (for `stats()`)."""
        return [
            (rt, {**vars(rt.counters), "breaker": rt.breaker.state.value,
                  "queued_cascades": len(rt.queue), "deferred_cascades": len(rt.deferred)})
            for rt in self.tiers
        ]  # fmt: skip

    def close_tiers(self) -> None:
        """Close every tier (blocks; call without the lock)."""
        for rt in self.tiers:
            try:
                rt.tier.close()
            except Exception:  # noqa: BLE001
                _log.exception("tier %s: close raised", rt.name)
