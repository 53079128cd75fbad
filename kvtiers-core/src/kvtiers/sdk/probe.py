"""`AsyncProbe`: existence checks that cannot be answered at once (shared storage
written by other processes, peers), batched onto one background thread.

A tier's `lookup` asks `probe.check(key)`: a fresh cached verdict answers HIT or
MISS at once; otherwise the key is queued and the answer is RETRY. The thread takes
everything queued so far (one scheduler step's worth) and calls the tier's batch
function once. Verdicts are cached: positives for `hit_ttl_s`, negatives for
`miss_ttl_s` (short, so blocks written by others show up soon). Never blocks the
caller; an exception in the probe function turns the batch into misses and is logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from kvtiers.contract.clock import Clock, monotonic
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.stats import StatsRecorder

ProbeFn = Callable[[Sequence[BlockKey]], Iterable[BlockKey]]

__all__ = ["AsyncProbe", "ProbeFn", "probed_lookup"]

_log = logging.getLogger("kvtiers.probe")


class AsyncProbe:
    """`probe_fn(keys)` returns the subset of `keys` that exist (any iterable)."""

    def __init__(
        self,
        probe_fn: ProbeFn,
        *,
        clock: Clock = monotonic,
        hit_ttl_s: float = 60.0,
        miss_ttl_s: float = 1.0,
        max_cached: int = 1 << 20,
        name: str = "kvtiers-probe",
    ):
        self._fn = probe_fn
        self._clock = clock
        self._hit_ttl = hit_ttl_s
        self._miss_ttl = miss_ttl_s
        self._max_cached = max_cached
        self._verdicts: dict[BlockKey, tuple[bool, float]] = {}
        self._queued: dict[BlockKey, None] = {}
        self._inflight: frozenset[BlockKey] = frozenset()  # the batch being probed
        self._cv = threading.Condition()
        self._closed = False
        self._busy = False
        self.batches = 0
        self.probed = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def check(self, key: BlockKey) -> LookupResult:
        """HIT/MISS from a fresh verdict, else RETRY (and the key is probed soon)."""
        now = self._clock()
        with self._cv:
            if self._closed:
                return LookupResult.MISS
            verdict = self._verdicts.get(key)
            if verdict is not None and verdict[1] > now:
                return LookupResult.HIT if verdict[0] else LookupResult.MISS
            if key not in self._queued and key not in self._inflight:
                self._queued[key] = None
                self._cv.notify()
            return LookupResult.RETRY

    def record(self, key: BlockKey, exists: bool) -> None:
        """Set a verdict the tier knows first-hand (it just wrote or deleted the key)."""
        ttl = self._hit_ttl if exists else self._miss_ttl
        with self._cv:
            self._remember(key, exists, self._clock() + ttl)

    def forget(self, key: BlockKey) -> None:
        with self._cv:
            self._verdicts.pop(key, None)

    def idle(self) -> bool:
        """True when nothing is queued or being probed (tests wait on this)."""
        with self._cv:
            return not self._queued and not self._busy

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not self._queued and not self._busy, timeout)

    def close(self, timeout: float = 1.0) -> None:
        """Stop probing. Waits at most `timeout` for a probe in progress: the thread
        is a daemon, and a probe stuck on the network must not hang shutdown."""
        with self._cv:
            self._closed = True
            self._queued.clear()
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _remember(self, key: BlockKey, exists: bool, until: float) -> None:
        if len(self._verdicts) >= self._max_cached and key not in self._verdicts:
            # Drop the oldest verdict (dicts keep insertion order): bounded memory.
            self._verdicts.pop(next(iter(self._verdicts)))
        self._verdicts[key] = (exists, until)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queued or self._closed)
                if self._closed:
                    return
                batch = list(self._queued)
                self._queued.clear()
                self._inflight = frozenset(batch)
                self._busy = True
            try:
                found = set(self._fn(batch))
            except Exception:  # noqa: BLE001 - a probe failure is a miss, never a crash
                _log.exception("probe of %d keys failed; treating them as misses", len(batch))
                found = set()
            now = self._clock()
            with self._cv:
                for key in batch:
                    hit = key in found
                    self._remember(key, hit, now + (self._hit_ttl if hit else self._miss_ttl))
                self.batches += 1
                self.probed += len(batch)
                self._inflight = frozenset()
                self._busy = False
                self._cv.notify_all()


def probed_lookup(key: BlockKey, held: bool, probe: AsyncProbe | None,
                  stats: StatsRecorder | None = None) -> LookupResult:
    """The lookup of a tier that knows what it holds and may ask shared storage about
    the rest: `held` -> HIT; no `probe` (the store is not shared: what the tier does
    not hold is nowhere) -> MISS; else the probe's verdict, RETRY until it has one.
    The answer is counted in `stats` once decided (a RETRY counts nothing).
    Scheduler thread; O(1)."""
    if held:
        answer = LookupResult.HIT
    elif probe is None:
        answer = LookupResult.MISS
    else:
        answer = probe.check(key)
    if stats is not None and answer is not LookupResult.RETRY:
        stats.lookup(answer is LookupResult.HIT)
    return answer
