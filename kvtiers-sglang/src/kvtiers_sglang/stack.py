"""`TierStack`: kvtiers tiers answering SGLang's synchronous storage calls.

SGLang asks its L3 storage synchronously, from several of its threads at once (the
prefetch thread, the backup thread): does this run of pages exist, read these pages
into host slots, write these. kvtiers tiers are asynchronous: lookups answered from
their index, jobs submitted and reported later. This class bridges the two:

- **one caller at a time**: every call into a tier (the methods kvtiers' contract
  gives the scheduler thread: `lookup`, `submit_*`, `get_finished_jobs`, `stats`)
  is made under one lock, so a tier sees what it sees under kvtiers' manager;
- **waiting without the lock**: a caller submits its jobs, then polls for their
  results (any caller's poll hands every finished job to its owner), sleeping
  between polls (20 us growing to 1 ms);
- **deadlines**: each job carries `job_timeout_s` (tiers fail work not started by
  then with `timeout`); a caller whose jobs are still unreported a grace period
  later (`min(1 s, job_timeout_s)`) stops waiting and reports those keys failed. The
  job stays *abandoned* until its tier reports it: the blocks lent for it are given
  back only then, and the tier's circuit breaker counts it;
- **lookups**: a tier still probing (`RETRY`, shared storage written by another
  process) is asked again, for at most `exists_wait_s` per SGLang call; a key still
  unknown then is a miss;
- **stores** go to every tier whose breaker allows it and whose admission policy
  admits the key (write-through: SGLang's host pool plays kvtiers' CPU pool); a key
  is stored when one tier committed it;
- **failures** are misses: a tier's failed, corrupt or timed-out key is `False`,
  never an exception; a tier whose jobs fail `breaker.failures` times in a row is
  skipped for `breaker.cooldown_s`.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvtiers import BlockKey, FailureReason, JobResult, LookupResult, SecondaryTier
from kvtiers import TransferJob as KvJob
from kvtiers.manager import CircuitBreaker
from kvtiers.sdk import AdmissionPolicy, Clock, TierStats, monotonic

#: reasons that say the tier is unwell (a miss or a corrupt block is data, not health)
_UNHEALTHY = frozenset({FailureReason.IO, FailureReason.TIMEOUT, FailureReason.CLOSED})
_POLL_FIRST_S = 20e-6
_POLL_MAX_S = 1e-3
GRACE_MAX_S = 1.0


@dataclass
class StackCounters:
    """What the bridge itself saw (the tiers count the rest)."""

    exists_calls: int = 0
    exists_waits: int = 0  # calls that waited for a probing tier
    exists_unresolved: int = 0  # keys still probing when the wait ran out
    loads_failed: int = 0  # keys a load reported failed (any reason)
    stores_failed: int = 0
    stores_not_admitted: int = 0  # (key, tier) pairs an admission policy refused
    abandoned_jobs: int = 0  # jobs past their deadline + grace, not yet reported then
    abandoned_pending: int = 0  # of those, still unreported now
    failed_by_reason: dict[str, int] = field(default_factory=dict)


@dataclass
class _Tier:
    name: str
    tier: SecondaryTier
    breaker: CircuitBreaker
    admission: AdmissionPolicy | None


class TierStack:
    """The tiers of one SGLang rank, in config order (searched in that order).
    Thread-safe; every method may block (up to `job_timeout_s` plus the grace, or
    `exists_wait_s` for lookups), none raises for a tier's failure."""

    def __init__(
        self,
        tiers: Sequence[tuple[str, SecondaryTier, AdmissionPolicy | None]],
        *,
        clock: Clock = monotonic,
        job_timeout_s: float = 30.0,
        exists_wait_s: float = 0.2,
        breaker_failures: int = 5,
        breaker_cooldown_s: float = 10.0,
        publish: Callable[[dict[str, TierStats]], None] | None = None,
    ):
        self._tiers = [
            _Tier(name, tier, CircuitBreaker(clock, breaker_failures, breaker_cooldown_s), adm)
            for name, tier, adm in tiers
        ]
        self._clock = clock
        self.job_timeout_s = job_timeout_s
        self.grace_s = min(GRACE_MAX_S, job_timeout_s)
        self.exists_wait_s = exists_wait_s
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._done: dict[int, JobResult] = {}
        self._waiting: set[int] = set()
        # job id -> (tier index, called with the result when the tier reports it)
        self._abandoned: dict[int, Callable[[JobResult], None]] = {}
        self._job_tier: dict[int, int] = {}
        self._publish = publish
        self.counters = StackCounters()
        self._counting = threading.Lock()  # counters outside `_lock` (never held with it)
        self._closed = False

    @property
    def names(self) -> list[str]:
        return [t.name for t in self._tiers]

    def tier(self, name: str) -> SecondaryTier:
        """The tier named `name` in the stack (as built: metered)."""
        for t in self._tiers:
            if t.name == name:
                return t.tier
        raise KeyError(f"no tier {name!r} in the stack (tiers: {', '.join(self.names)})")

    # -- lookups ------------------------------------------------------------------

    def _where(self, key: BlockKey) -> int | None | LookupResult:
        """Under the lock: the index of the first tier holding `key`, else RETRY when
        a tier is still probing, else MISS."""
        probing = False
        for i, t in enumerate(self._tiers):
            if not t.breaker.allows():
                continue
            answer = t.tier.lookup(key)
            if answer is LookupResult.HIT:
                return i
            if answer is LookupResult.RETRY or answer is LookupResult.HIT_PENDING:
                probing = True
        return LookupResult.RETRY if probing else LookupResult.MISS

    def leading_pages(self, pages: Sequence[Sequence[BlockKey]]) -> int:
        """How many pages, from the first, the tiers hold whole (each of a page's
        keys held by some tier). Each round asks every page up to the first one
        missing, so all probes start at once; a round repeats while a page before
        that is still probing, for at most `exists_wait_s` in all. A page still
        unknown then ends the run."""
        self._count(exists_calls=1)
        found = 0  # pages known whole, from the start
        give_up = self._clock() + self.exists_wait_s
        delay = _POLL_FIRST_S
        waited = False
        while True:
            probing = 0
            with self._lock:
                for page in pages[found:]:
                    verdicts = [self._where(k) for k in page]
                    if any(v is LookupResult.MISS for v in verdicts):
                        break
                    if any(v is LookupResult.RETRY for v in verdicts):
                        probing += 1
                    elif not probing:
                        found += 1
            if not probing:
                return self._end_exists(found, waited, 0)
            if self._clock() >= give_up:
                return self._end_exists(found, waited, probing)
            waited = True
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)

    def _count(self, **deltas: int) -> None:
        """Add to the bridge's counters (any thread; not under `_lock`)."""
        with self._counting:
            for name, n in deltas.items():
                setattr(self.counters, name, getattr(self.counters, name) + n)

    def _end_exists(self, found: int, waited: bool, unresolved: int) -> int:
        self._count(exists_waits=int(waited), exists_unresolved=unresolved)
        return found

    def find(self, keys: Sequence[BlockKey]) -> list[int | None]:
        """The tier holding each key (None: none does), waiting at most
        `exists_wait_s` for tiers that are still probing."""
        out: list[int | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        give_up = self._clock() + self.exists_wait_s
        delay = _POLL_FIRST_S
        while True:
            again = []
            with self._lock:
                for i in todo:
                    where = self._where(keys[i])
                    if isinstance(where, int):
                        out[i] = where
                    elif where is LookupResult.RETRY:
                        again.append(i)
            if not again or self._clock() >= give_up:
                self._count(exists_unresolved=len(again))
                return out
            todo = again
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)

    # -- jobs ---------------------------------------------------------------------

    def load(
        self, keys: Sequence[BlockKey], slots: Sequence[int],
        on_abandoned: Callable[[Sequence[int]], None] | None = None,
    ) -> list[bool]:
        """Read each key into its slot from the tier that holds it; True where the
        tier reported the key loaded (and verified, for a verifying tier).
        `on_abandoned(slots)` is called (from a later caller's poll) for slots of a
        job abandoned at its deadline, once the tier reports it."""
        where = self.find(keys)
        by_tier: dict[int, list[int]] = {}
        for i, tier in enumerate(where):
            if tier is not None:
                by_tier.setdefault(tier, []).append(i)
        ok = self._run(by_tier, keys, slots, load=True, on_abandoned=on_abandoned)
        self._count(loads_failed=len(keys) - sum(ok))
        return ok

    def store(
        self, keys: Sequence[BlockKey], slots: Sequence[int],
        on_abandoned: Callable[[Sequence[int]], None] | None = None,
    ) -> list[bool]:
        """Write each key from its slot to every tier that admits it; True where one
        tier committed the key (or already held it)."""
        by_tier: dict[int, list[int]] = {}
        with self._lock:
            for t_index, t in enumerate(self._tiers):
                if not t.breaker.allows():
                    continue
                chosen = list(range(len(keys)))
                if t.admission is not None:
                    chosen = [i for i in chosen if t.admission.admit(keys[i])]
                    self.counters.stores_not_admitted += len(keys) - len(chosen)
                if chosen:
                    by_tier[t_index] = chosen
        ok = self._run(by_tier, keys, slots, load=False, on_abandoned=on_abandoned)
        self._count(stores_failed=len(keys) - sum(ok))
        return ok

    def _run(
        self, by_tier: dict[int, list[int]], keys: Sequence[BlockKey], slots: Sequence[int],
        *, load: bool, on_abandoned: Callable[[Sequence[int]], None] | None,
    ) -> list[bool]:
        ok = [False] * len(keys)
        if not by_tier or self._closed:
            return ok
        deadline = self._clock() + self.job_timeout_s
        jobs: dict[int, tuple[int, list[int]]] = {}
        with self._lock:
            for t_index, picked in by_tier.items():
                job = KvJob(next(self._ids), [keys[i] for i in picked],
                            [slots[i] for i in picked], deadline)
                jobs[job.job_id] = (t_index, picked)
                self._waiting.add(job.job_id)
                self._job_tier[job.job_id] = t_index
                tier = self._tiers[t_index].tier
                try:
                    (tier.submit_load if load else tier.submit_store)(job)
                except Exception:  # noqa: BLE001 - a tier's bug is a miss, not SGLang's crash
                    self._waiting.discard(job.job_id)
                    self._done[job.job_id] = JobResult.all_failed(job, FailureReason.IO)
        results = self._wait(list(jobs), deadline + self.grace_s, slots, jobs, on_abandoned)
        if self._publish is not None:  # the scrape sees every call's counters
            with self._lock:
                self._publish(self._stats_locked())
        for job_id, (_, picked) in jobs.items():
            result = results.get(job_id)
            if result is None:
                continue
            failed = result.failed
            for i in picked:
                if keys[i] not in failed:
                    ok[i] = True
            with self._counting:
                counts = self.counters.failed_by_reason
                for reason in failed.values():
                    counts[reason.value] = counts.get(reason.value, 0) + 1
        return ok

    def _wait(
        self, ids: list[int], cutoff: float, slots: Sequence[int],
        jobs: dict[int, tuple[int, list[int]]],
        on_abandoned: Callable[[Sequence[int]], None] | None,
    ) -> dict[int, JobResult]:
        """Each job's result, or none for those still unreported at `cutoff` (they
        are abandoned: their slots are given back when the tier reports them)."""
        out: dict[int, JobResult] = {}
        delay = _POLL_FIRST_S
        pending = set(ids)
        while True:
            with self._lock:
                self._poll()
                for job_id in list(pending):
                    result = self._done.pop(job_id, None)
                    if result is not None:
                        out[job_id] = result
                        pending.discard(job_id)
                        self._waiting.discard(job_id)
                if not pending:
                    return out
                if self._clock() >= cutoff:
                    for job_id in pending:
                        self._waiting.discard(job_id)
                        _, picked = jobs[job_id]
                        mine = [slots[i] for i in picked]
                        self._abandoned[job_id] = _releaser(on_abandoned, mine)
                        self._tiers[self._job_tier[job_id]].breaker.failure()
                    self.counters.abandoned_jobs += len(pending)
                    self.counters.abandoned_pending = len(self._abandoned)
                    return out
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)

    def _poll(self) -> None:
        """Under the lock: collect every tier's finished jobs; hand each to its
        waiter, or to its release when it was abandoned."""
        for t in self._tiers:
            try:
                finished = t.tier.get_finished_jobs()
            except Exception:  # noqa: BLE001 - a tier's bug must not stop SGLang's thread
                continue
            for result in finished:
                self._job_tier.pop(result.job_id, None)
                unhealthy = any(r in _UNHEALTHY for r in result.failed.values())
                t.breaker.failure() if unhealthy else t.breaker.success()
                release = self._abandoned.pop(result.job_id, None)
                if release is not None:
                    release(result)
                elif result.job_id in self._waiting:
                    self._done[result.job_id] = result
        self.counters.abandoned_pending = len(self._abandoned)

    # -- stats and the end --------------------------------------------------------

    def _stats_locked(self) -> dict[str, TierStats]:
        out = {}
        for t in self._tiers:
            try:
                out[t.name] = t.tier.stats()
            except Exception:  # noqa: BLE001 - a tier that cannot say is left out
                continue
        return out

    def stats(self) -> dict[str, TierStats]:
        """Each tier's `stats()`, by name."""
        with self._lock:
            return self._stats_locked()

    def counters_snapshot(self) -> dict[str, object]:
        """The bridge's counters (`StackCounters`) as a plain dict, copied."""
        with self._counting:
            out: dict[str, object] = dict(vars(self.counters))
            out["failed_by_reason"] = dict(self.counters.failed_by_reason)
        return out

    def breaker_open(self) -> list[str]:
        """The tiers skipped now (their breaker is open)."""
        with self._lock:
            return [t.name for t in self._tiers if not t.breaker.allows()]

    def close(self, drain_s: float | None = None) -> None:
        """Wait up to `drain_s` (default `job_timeout_s`) for each tier's jobs, then
        close the tiers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        wait = self.job_timeout_s if drain_s is None else drain_s
        for t in self._tiers:
            with contextlib.suppress(Exception):  # closing goes on
                t.tier.drain(wait)
        with self._lock:
            self._poll()
        for t in self._tiers:
            with contextlib.suppress(Exception):
                t.tier.close()


def _releaser(
    on_abandoned: Callable[[Sequence[int]], None] | None, slots: list[int]
) -> Callable[[JobResult], None]:
    def release(_: JobResult) -> None:
        if on_abandoned is not None:
            on_abandoned(slots)

    return release
