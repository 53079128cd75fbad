"""Small hand-driven tiers for the manager's unit tests.

`ScriptedTier` keeps blocks in a dict and does each job on the caller's thread (a
memcpy), so a test decides exactly when results appear: `hold` keeps submitted jobs
until `release()`, `fail` makes jobs fail with `io`, `raising` names the methods that
raise, `probe_gate` answers lookups through an `AsyncProbe` whose batches wait for
the gate. `PeerMemoryTier` is the real memory tier declaring `serves_peers`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from kvtiers.contract.jobs import FailureReason, JobResult, TransferJob
from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.stats import TierStats
from kvtiers.contract.tier import SecondaryTier, TierContext
from kvtiers.sdk.integrity import checksum
from kvtiers.sdk.probe import AsyncProbe
from kvtiers.tiers.memory import MemoryTier


class TierBoom(RuntimeError):
    """What a `ScriptedTier` raises from the methods named in `raising`."""


class ScriptedTier(SecondaryTier):
    verifies: ClassVar[bool] = True

    def __init__(self, ctx: TierContext, *, probe_gate: bool = False, hold: bool = False):
        super().__init__(ctx, {})
        self.data: dict[BlockKey, bytes] = {}
        self.fail = False  # jobs fail with `io`
        self.hold = hold  # jobs wait in `held` until `release()`
        self.raising: set[str] = set()
        self.held: list[tuple[TransferJob, bool]] = []
        self.finished: list[JobResult] = []
        self.calls: Counter[str] = Counter()
        self.touched: list[list[BlockKey]] = []
        self.requests: list[tuple[str, str]] = []
        self.request_params: dict[str, Mapping[str, Any] | None] = {}  # by request id
        self.closed = False
        self.probe: AsyncProbe | None = None
        self.gate = threading.Event()
        if probe_gate:
            self.probe = AsyncProbe(self._probe, clock=ctx.clock, hit_ttl_s=60, miss_ttl_s=1)

    def _probe(self, keys: list[BlockKey]) -> list[BlockKey]:
        self.calls["probe_batch"] += 1
        assert self.gate.wait(30), "probe gate never opened"
        return [k for k in keys if k in self.data]

    def _enter(self, name: str) -> None:
        self.calls[name] += 1
        if name in self.raising:
            raise TierBoom(f"{name} failed on purpose")

    def put(self, key: BlockKey, data: bytes) -> None:
        """Hold a block, as if another process had written it."""
        self.data[key] = data

    # The contract.

    def lookup(self, key: BlockKey) -> LookupResult:
        self._enter("lookup")
        if self.probe is not None:
            return self.probe.check(key)
        return LookupResult.HIT if key in self.data else LookupResult.MISS

    def submit_store(self, job: TransferJob) -> None:
        self._enter("submit_store")
        self._submit(job, load=False)

    def submit_load(self, job: TransferJob) -> None:
        self._enter("submit_load")
        self._submit(job, load=True)

    def _submit(self, job: TransferJob, load: bool) -> None:
        if self.hold:
            self.held.append((job, load))
        else:
            self.finished.append(self._run(job, load))

    def release(self) -> None:
        held, self.held = self.held, []
        for job, load in held:
            self.finished.append(self._run(job, load))

    def _run(self, job: TransferJob, load: bool) -> JobResult:
        if self.fail:
            return JobResult.all_failed(job, FailureReason.IO)
        pool, result = self.ctx.pool, JobResult(job.job_id)
        for key, slot in zip(job.keys, job.slots, strict=True):
            if load:
                data = self.data.get(key)
                if data is None:
                    result.failed[key] = FailureReason.MISSING
                    continue
                pool.block(slot)[:] = data
                assert checksum(pool.block(slot)) == checksum(data)
            else:
                self.data[key] = bytes(pool.block(slot))
                if self.probe is not None:
                    self.probe.record(key, True)
            result.ok.append(key)
        result.bytes_moved = len(result.ok) * self.ctx.block_bytes
        return result

    def get_finished_jobs(self) -> list[JobResult]:
        self._enter("get_finished_jobs")
        done, self.finished = self.finished, []
        return done

    def drain(self, timeout: float | None = None) -> bool:
        self._enter("drain")
        return not self.held

    def close(self) -> None:
        self._enter("close")
        self.closed = True
        if self.probe is not None:
            self.probe.close()

    def stats(self) -> TierStats:
        self._enter("stats")
        return TierStats(usage_bytes=len(self.data) * self.ctx.block_bytes)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        self._enter("touch")
        self.touched.append(list(keys))

    def on_request_start(self, request_id: str, params: Mapping[str, Any] | None = None) -> None:
        self._enter("on_request_start")
        self.requests.append(("start", request_id))
        self.request_params[request_id] = params

    def on_request_finished(self, request_id: str) -> None:
        self._enter("on_request_finished")
        self.requests.append(("finished", request_id))


class PeerMemoryTier(MemoryTier):
    """The memory tier, declaring that it serves peers: the manager must then be safe
    to call (`lookup`, `create_store_job`, `complete_store_job`) from other threads."""

    serves_peers: ClassVar[bool] = True

    def serve_external_requests(self, parent: Any) -> None:
        self.parent = parent


class StuckTier(SecondaryTier):
    """Wraps a tier and holds every job it is given until `release()`, then hands it
    on without its deadline: a tier whose I/O got stuck past the manager's deadline
    and then completes anyway, writing into the slots late."""

    def __init__(self, inner: SecondaryTier):
        super().__init__(inner.ctx, {})
        self.inner = inner
        self.held: list[tuple[TransferJob, bool]] = []
        self.verifies = inner.verifies

    def lookup(self, key: BlockKey) -> LookupResult:
        return self.inner.lookup(key)

    def submit_store(self, job: TransferJob) -> None:
        self.held.append((job, False))

    def submit_load(self, job: TransferJob) -> None:
        self.held.append((job, True))

    def release(self) -> None:
        held, self.held = self.held, []
        for job, load in held:
            late = TransferJob(job.job_id, job.keys, job.slots, None)
            (self.inner.submit_load if load else self.inner.submit_store)(late)

    def get_finished_jobs(self) -> list[JobResult]:
        return self.inner.get_finished_jobs()

    def drain(self, timeout: float | None = None) -> bool:
        return self.inner.drain(timeout) and not self.held

    def close(self) -> None:
        self.held = []  # never started, and nobody asks for results after close
        self.inner.close()

    def stats(self) -> TierStats:
        return self.inner.stats()
