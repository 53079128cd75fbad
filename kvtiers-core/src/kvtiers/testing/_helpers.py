"""Building blocks of the conformance suite, public so tier authors can write their
own tests with them: contexts over a fresh pool, random keys and block bytes, and a
`JobTracker` that runs jobs to completion under a real-time safety bound, checking
each result against its job.

Waiting is polling with short real-time naps: a broken tier (a job never reported)
makes the test fail after `timeout_s`, never hang. No helper measures time.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence

from kvtiers.contract.clock import Clock, ManualClock
from kvtiers.contract.jobs import FailureReason, JobResult, TransferJob
from kvtiers.contract.keys import BlockKey, make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.contract.tier import SecondaryTier, TierContext

#: Real seconds a job or lookup may take before the suite calls the tier stuck.
DEFAULT_TIMEOUT_S = 30.0

# Job ids are unique across every tracker of the process, so that a wrapper tier and
# its inner tier never see one id twice, whoever submitted.
_job_ids = itertools.count(1)


def make_namespace(
    model: str = "kvtiers-conformance/model-a", block_bytes: int = 16384, revision: str = ""
) -> Namespace:
    """A namespace whose single KV group has blocks of `block_bytes` (even)."""
    if block_bytes < 2 or block_bytes % 2:
        raise ValueError(f"block_bytes must be even and >= 2, got {block_bytes}")
    geometry = BlockGeometry(
        layers=1, kv_heads=1, head_size=block_bytes // 2, dtype="uint8", tokens_per_block=1
    )
    return Namespace(model, (geometry,), revision)


def make_context(
    block_bytes: int = 16384,
    num_slots: int = 64,
    *,
    namespace: Namespace | None = None,
    clock: Clock | None = None,
    name: str = "tier-under-test",
    pool: PoolView | None = None,
) -> TierContext:
    """A context over `pool` (default: a fresh anonymous pool of `num_slots` slots of
    `block_bytes`), with a `ManualClock` unless told."""
    if pool is not None and pool.block_bytes != block_bytes:
        raise ValueError(f"pool blocks are {pool.block_bytes} bytes, not {block_bytes}")
    return TierContext(
        pool=PoolView.anonymous(num_slots, block_bytes) if pool is None else pool,
        namespace=namespace or make_namespace(block_bytes=block_bytes),
        clock=ManualClock() if clock is None else clock,
        name=name,
    )


def random_bytes(n: int, rng: random.Random | None = None) -> bytes:
    return rng.randbytes(n) if rng is not None else os.urandom(n)


def random_keys(n: int, rng: random.Random | None = None) -> list[BlockKey]:
    """`n` distinct random keys of KV group 0."""
    keys: dict[BlockKey, None] = {}
    while len(keys) < n:
        keys[make_key(random_bytes(16, rng))] = None
    return list(keys)


def fill_slots(
    pool: PoolView, slots: Iterable[int], rng: random.Random | None = None
) -> list[bytes]:
    """Write random block bytes into each slot; return them, in `slots` order."""
    out = []
    for slot in slots:
        data = random_bytes(pool.block_bytes, rng)
        pool.block(slot)[:] = data
        out.append(data)
    return out


def poison_slots(pool: PoolView, slots: Iterable[int]) -> None:
    """Fill whole slots (padding included) with random bytes, so that a load that
    reports success without writing, or writes the wrong bytes, is caught."""
    for slot in slots:
        start = slot * pool.slot_bytes
        pool.buffer[start : start + pool.slot_bytes] = os.urandom(pool.slot_bytes)


def snapshot(pool: PoolView) -> bytes:
    """A copy of every byte of the pool."""
    return bytes(pool.buffer[: pool.nbytes])


def expected_pool(pool: PoolView, before: bytes, blocks: dict[int, bytes]) -> bytes:
    """`before` with the blocks of some slots replaced: what the pool must hold after
    loads that wrote exactly those blocks and nothing else."""
    out = bytearray(before)
    for slot, data in blocks.items():
        start = slot * pool.slot_bytes
        out[start : start + len(data)] = data
    return bytes(out)


def check_result(job: TransferJob, result: JobResult) -> None:
    """Assert that `result` accounts for every key of `job` exactly once."""
    assert result.job_id == job.job_id, f"result for job {result.job_id}, expected {job.job_id}"
    keys = set(job.keys)
    ok, failed = set(result.ok), set(result.failed)
    assert not ok & failed, f"job {job.job_id}: keys both ok and failed: {ok & failed}"
    assert ok | failed == keys, (
        f"job {job.job_id}: result names keys {(ok | failed) - keys} it was not given and "
        f"omits {keys - (ok | failed)}"
    )
    assert len(result.ok) == len(ok) or len(job.keys) != len(keys), (
        f"job {job.job_id}: a key is reported ok twice"
    )
    for key, reason in result.failed.items():
        assert isinstance(reason, FailureReason), f"{key!r} failed with {reason!r}"
    assert result.bytes_moved >= 0, f"job {job.job_id}: bytes_moved {result.bytes_moved}"
    assert result.seconds >= 0, f"job {job.job_id}: seconds {result.seconds}"


def wait_until(
    predicate: Callable[[], bool], what: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Poll `predicate` until true; fail (AssertionError) after `timeout_s` real seconds."""
    end = time.monotonic() + timeout_s
    nap = 0.0002
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen within {timeout_s}s: is the tier stuck?")
        time.sleep(nap)
        nap = min(nap * 2, 0.01)


def resolve_lookup(
    tier: SecondaryTier, key: BlockKey, timeout_s: float = DEFAULT_TIMEOUT_S
) -> LookupResult:
    """Ask until the answer is not RETRY (a probe in flight); return HIT or MISS."""
    answer = tier.lookup(key)

    def known() -> bool:
        nonlocal answer
        answer = tier.lookup(key)
        return answer is not LookupResult.RETRY

    if answer is LookupResult.RETRY:
        wait_until(known, f"lookup of {key.hex()} resolving", timeout_s)
    assert answer in (LookupResult.HIT, LookupResult.MISS), f"a tier answered {answer}"
    return answer


def resident(
    tier: SecondaryTier, keys: Iterable[BlockKey], timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[BlockKey]:
    """The keys, in the order given, that the tier answers HIT for (`resolve_lookup`)."""
    return [k for k in keys if resolve_lookup(tier, k, timeout_s) is LookupResult.HIT]


def check_blocks(pool: PoolView, blocks: Iterable[tuple[int, bytes]], what: str = "") -> None:
    """Assert that each (slot, bytes) pair is what the slot's block holds."""
    suffix = f" ({what})" if what else ""
    for slot, data in blocks:
        assert bytes(pool.block(slot)) == data, f"wrong bytes in slot {slot}{suffix}"


class JobTracker:
    """Submits jobs to one tier and collects their results, asserting the contract:
    every job is reported exactly once, with a result that accounts for each key.

    Use one tracker per tier, and do not call the tier's `get_finished_jobs`
    yourself while one is in use: the tracker must see every result.
    """

    def __init__(self, tier: SecondaryTier, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.tier = tier
        self.timeout_s = timeout_s
        self.jobs: dict[int, tuple[TransferJob, bool]] = {}
        self.results: dict[int, JobResult] = {}

    def _job(self, keys: Sequence[BlockKey], slots: Sequence[int],
             deadline: float | None) -> TransferJob:
        return TransferJob(next(_job_ids), list(keys), list(slots), deadline)

    def store(self, keys: Sequence[BlockKey], slots: Sequence[int],
              deadline: float | None = None) -> TransferJob:
        """Submit a store of `keys` from `slots`; returns the job (results via `wait`)."""
        job = self._job(keys, slots, deadline)
        self.jobs[job.job_id] = (job, False)
        self.tier.submit_store(job)
        return job

    def load(self, keys: Sequence[BlockKey], slots: Sequence[int],
             deadline: float | None = None) -> TransferJob:
        """Submit a load of `keys` into `slots`; returns the job (results via `wait`)."""
        job = self._job(keys, slots, deadline)
        self.jobs[job.job_id] = (job, True)
        self.tier.submit_load(job)
        return job

    def poll(self, *, others: bool = False) -> list[JobResult]:
        """One `get_finished_jobs` call, its results checked and recorded. With
        `others`, results for jobs this tracker never submitted are ignored instead
        of failing (someone else, such as a wrapper tier, submitted them)."""
        results = self.tier.get_finished_jobs()
        assert isinstance(results, list), f"get_finished_jobs returned {type(results)}"
        mine = []
        for result in results:
            assert isinstance(result, JobResult), f"get_finished_jobs returned {result!r}"
            known = self.jobs.get(result.job_id)
            if known is None and others:
                continue
            assert known is not None, f"result for job {result.job_id}, never submitted"
            assert result.job_id not in self.results, f"job {result.job_id} reported twice"
            check_result(known[0], result)
            self.results[result.job_id] = result
            mine.append(result)
        return mine

    def settle(self, *, others: bool = False) -> None:
        """Wait (`drain`) until the tier is idle, then poll once more: every job must
        be reported by then, and none again (a late duplicate fails here)."""
        assert self.tier.drain(self.timeout_s) is True, (
            f"drain did not return True within {self.timeout_s}s: is the tier stuck?")
        self.poll(others=others)
        assert not self.outstanding, (
            f"jobs {self.outstanding} not reported although drain returned True")

    @property
    def outstanding(self) -> list[int]:
        """Ids of submitted jobs not reported yet."""
        return [i for i in self.jobs if i not in self.results]

    def wait(self, jobs: Iterable[TransferJob] | None = None) -> list[JobResult]:
        """Poll until the given jobs (default: all outstanding) are reported; their
        results in the order given."""
        ids = [j.job_id for j in jobs] if jobs is not None else self.outstanding

        def done() -> bool:
            self.poll()
            return all(i in self.results for i in ids)

        wait_until(done, f"results of jobs {ids}", self.timeout_s)
        return [self.results[i] for i in ids]

    def run_store(self, keys: Sequence[BlockKey], slots: Sequence[int],
                  deadline: float | None = None) -> JobResult:
        """Store and wait for the result."""
        return self.wait([self.store(keys, slots, deadline)])[0]

    def run_load(self, keys: Sequence[BlockKey], slots: Sequence[int],
                 deadline: float | None = None) -> JobResult:
        """Load and wait for the result."""
        return self.wait([self.load(keys, slots, deadline)])[0]

    def store_each(self, keys: Iterable[BlockKey], slot: int = 0,
                   rng: random.Random | None = None) -> dict[BlockKey, bytes]:
        """Store `keys` one job at a time from `slot`, each with fresh random bytes,
        asserting success (so the order of `keys` is the order of their age); the
        bytes stored per key."""
        pool = self.tier.ctx.pool
        data: dict[BlockKey, bytes] = {}
        for key in keys:
            data[key] = fill_slots(pool, [slot], rng)[0]
            result = self.run_store([key], [slot])
            assert result.success, f"store of one block failed: {result.failed}"
        return data


def run_job(
    tier: SecondaryTier, job: TransferJob, *, load: bool, timeout_s: float = DEFAULT_TIMEOUT_S
) -> JobResult:
    """Submit one job and wait for its result; any other result is an error (use a
    `JobTracker` when several jobs are in flight)."""
    tracker = JobTracker(tier, timeout_s)
    tracker.jobs[job.job_id] = (job, load)
    (tier.submit_load if load else tier.submit_store)(job)
    return tracker.wait([job])[0]
