"""The replay: the shared chat workload driven through the real stack with an
engine's call protocol, moving and checking real bytes.

Per request (one `start` event), as a scheduler with GPU prefix caching off does it:

1. `lookup_prefix` over the prompt's block keys. While it says `retry` (a promotion
   from a secondary tier or a tier's existence probe is in flight) the request waits
   and is asked again after each later step, as an engine defers such a request.
2. `prepare_load` + `touch` of the leading hits; one swapper load job copies them
   from the pool slots into the request's GPU pages (first poisoned, see
   `content.POISON`).
3. The rest of the prompt is "computed": its pages get their blocks' bytes
   (`BlockContent.fill`), and `prepare_store` + one swapper store job offload the
   blocks the pool lacks.

When a job ends (`DeviceSwapper.get_finished`): a load's pages are checked against
the bytes of their keys — every byte, one vectorised check per job — before
`complete_load`; a mismatch stops the run (`BenchIntegrityError`, naming the key and
where the pool's copy came from). A store's keys get `complete_store`. When the
request finishes (its `finish` event) its output blocks are filled and stored the
same way, and its pages are freed once its copies ended. `manager.step()` runs
after every event.

With no manager (`--compare`'s "no offloading" run) every prompt token is
recomputed and nothing is stored.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvtiers.bench.results import CPU, Counters, RunResult, Sample, direction_bytes
from kvtiers.bench.stack import BenchError, BenchIntegrityError, Stack
from kvtiers.bench.workload import Request, Workload, WorkloadSpec
from kvtiers.contract.keys import BlockKey
from kvtiers.manager import OffloadEvent
from kvtiers.manager.outputs import CPU as POOL
from kvtiers.swap import SwapResult

ProgressFn = Callable[[int, float, "Counters"], None]

# When every request in flight waits for a promotion or probe, the replay steps
# at this interval (an engine would be running forward passes meanwhile); shorter
# only burns the CPU the tiers' threads need.
IDLE_STEP_S = 0.002
# After the last request, how often the wait for the tiers' last copies updates
# the progress bar.
SETTLE_STEP_S = 0.25


@dataclass(eq=False)
class _Live:
    req: Request
    pages: np.ndarray
    admitted: bool = False
    wait_from: float | None = None
    last_hits: int = 0
    jobs: set[int] = field(default_factory=set)


@dataclass(eq=False)
class _Job:
    kind: str  # "load" | "store" | "out"
    live: _Live
    keys: list[BlockKey]
    pages: np.ndarray
    slots: Sequence[int]
    release: np.ndarray | None = None  # pages to free when the job ends ("out")


class Replay:
    """One run of `spec` through `stack`. `duration_s`: stop starting requests after
    that many seconds (the rest finish). `max_wait_s`: how long a request waits for
    promotions/probes before it is served what is there (the manager times jobs out
    before that)."""

    def __init__(
        self,
        stack: Stack,
        spec: WorkloadSpec,
        *,
        label: str,
        duration_s: float | None = None,
        max_wait_s: float = 31.0,
        sample_s: float = 1.0,
        progress: ProgressFn | None = None,
    ):
        self.stack = stack
        self.spec = spec
        self.label = label
        self.mgr = stack.manager
        self.swap = stack.swapper
        self.kv = stack.kv
        self.content = stack.kv.content
        self.pages = stack.kv.pages
        self.bt = spec.block_tokens
        self.block_bytes = stack.kv.content.block_bytes
        self.duration_s = duration_s
        self.max_wait_s = max_wait_s
        self.sample_s = sample_s
        self.progress = progress
        self.c = Counters()
        self.samples: list[Sample] = []
        self._live: dict[str, _Live] = {}
        self._waiting: list[_Live] = []
        self._jobs: dict[int, _Job] = {}
        self._next_id = 1
        self._skipped: set[str] = set()
        # Blocks in the pool that a promotion brought: key -> tier (while resident);
        # `_fresh`: promoted and not yet served (the first use is credited to the tier).
        self._promoted_from: dict[BlockKey, str] = {}
        self._fresh: dict[BlockKey, str] = {}
        if self.mgr is not None:
            # The pool's events name the tier each promotion came from.
            self.mgr.enable_events()

    # ------------------------------------------------------------------ the run

    def run(self) -> RunResult:
        perf = time.perf_counter
        self._t0 = t0 = perf()
        self._next_sample = t0
        self._next_progress = t0
        deadline = None if self.duration_s is None else t0 + self.duration_s
        for kind, req in Workload(self.spec):
            late = deadline is not None and perf() >= deadline
            if kind == "start":
                if late:
                    self._skipped.add(req.req_id)
                else:
                    self._start(req)
            elif req.req_id in self._skipped:
                self._skipped.discard(req.req_id)
            else:
                self._finish(req)
            self._tick()
            if late and not self._live:
                break
        self._drain()
        wall = perf() - t0
        settled = self._settle()
        settle_s = perf() - t0 - wall
        self._sample(perf())
        self._report_progress()
        return RunResult(
            label=self.label,
            wall_s=wall,
            counters=self.c,
            tier_names=list(self.stack.tier_names),
            block_tokens=self.bt,
            block_bytes=self.block_bytes,
            manager_stats=self.mgr.stats() if self.mgr is not None else None,
            swap_stats=self.swap.stats() if self.swap is not None else None,
            samples=self.samples,
            stand_in={
                "device": str(self.kv.device),
                "layout": self.kv.kind,
                "pages": self.kv.num_pages,
                "bytes": self.kv.nbytes,
            },
            settle_s=settle_s,
            settled=settled,
        )

    # ------------------------------------------------------------------ requests

    def _start(self, req: Request) -> None:
        live = _Live(req, self._alloc(len(req.prompt_keys)))
        self._live[req.req_id] = live
        if self.mgr is None:
            self._admit(live, 0)
            return
        self.mgr.on_request_start(req.req_id)
        self._lookup(live)

    def _lookup(self, live: _Live) -> bool:
        """Ask the manager; admit the request unless it should wait and ask again."""
        assert self.mgr is not None
        perf = time.perf_counter
        t = perf()
        res = self.mgr.lookup_prefix(live.req.prompt_keys)
        now = perf()
        self.c.lookup_s.append(now - t)
        if res.retry:
            if live.wait_from is None:
                live.wait_from = now
                live.last_hits = res.hits
                self.c.waited_requests += 1
                self._waiting.append(live)
                return False
            # Fewer leading hits than last time: promotions of this prefix evict each
            # other (the pool cannot hold it); waiting would not converge, so the
            # request takes what is there now, as an engine would.
            thrashing = res.hits < live.last_hits
            live.last_hits = res.hits
            if not thrashing and now - live.wait_from < self.max_wait_s:
                return False
            if thrashing:
                self.c.thrash_admits += 1
            else:
                self.c.gave_up_waiting += 1
        if live.wait_from is not None:
            self.c.wait_s.append(now - live.wait_from)
        self._admit(live, res.hits, promoting=res.retry)
        return True

    def _admit(self, live: _Live, n: int, promoting: bool = False) -> None:
        req, c, bt = live.req, self.c, self.bt
        keys, pages = req.prompt_keys, live.pages
        c.prompt_tokens += req.prompt_tokens
        if n and promoting:
            # The promotions that this lookup started reserved slots by evicting, and
            # may have evicted some of the very hits it counted: keep those before
            # the first one gone (the manager's lookup does not protect them).
            assert self.mgr is not None
            slot_of = self.mgr.slot_of
            kept = next((i for i in range(n) if slot_of(keys[i]) is None), n)
            c.hits_evicted_by_lookup += n - kept
            n = kept
        if n:
            assert self.mgr is not None and self.swap is not None
            hits = keys[:n]
            slots = self.mgr.prepare_load(hits)
            self.mgr.touch(hits)
            self._credit(hits)
            self.content.poison(pages[:n])
            job_id = self._add_job(_Job("load", live, hits, pages[:n], slots))
            self.swap.submit_load(job_id, np.asarray(slots, np.int64), pages[:n], keys=hits)
        c.recomputed_tokens += req.prompt_tokens - n * bt
        if n < len(keys):
            self.content.fill(pages[n:], keys[n:])  # the prefill of what was not found
            if self.mgr is not None:
                self._store("store", live, keys[n:], pages[n:])
        live.admitted = True

    def _finish(self, req: Request) -> None:
        live = self._live.pop(req.req_id)
        while not live.admitted:  # its promotions/probes are still in flight
            self._tick()
            if not live.admitted:
                time.sleep(IDLE_STEP_S)
        self._wait_for(live.jobs)
        self.pages.release(live.pages)
        self.c.requests += 1
        out = req.output_keys
        if out:
            pages = self._alloc(len(out))
            self.content.fill(pages, out)  # the decode steps' KV
            if self.mgr is None or not self._store("out", live, out, pages, release=pages):
                self.pages.release(pages)
        if self.mgr is not None:
            self.mgr.on_request_finished(req.req_id)

    def _store(
        self,
        kind: str,
        live: _Live,
        keys: list[BlockKey],
        pages: np.ndarray,
        release: np.ndarray | None = None,
    ) -> bool:
        """prepare_store + one swapper store job; False when nothing was submitted."""
        assert self.mgr is not None and self.swap is not None
        t = time.perf_counter()
        out = self.mgr.prepare_store(keys)
        self.c.prepare_store_s.append(time.perf_counter() - t)
        if out is None:
            self.c.store_refused += len(keys)
            return False
        if not out.keys:
            return False
        if len(out.keys) != len(keys):  # some were present: keep the others' pages
            index = {k: i for i, k in enumerate(keys)}
            pages = pages[[index[k] for k in out.keys]]
        job_id = self._add_job(_Job(kind, live, out.keys, pages, out.slots, release))
        self.swap.submit_store(job_id, pages, np.asarray(out.slots, np.int64), keys=out.keys)
        return True

    def _credit(self, hits: list[BlockKey]) -> None:
        """Count served tokens per tier: a promoted block's first use is its tier's."""
        fresh = self._fresh
        if not fresh:
            self.c.serve(CPU, len(hits), len(hits) * self.bt)
            return
        for tier, n in Counter(fresh.pop(k, CPU) for k in hits).items():
            self.c.serve(tier, n, n * self.bt)

    # ------------------------------------------------------------------ jobs

    def _add_job(self, job: _Job) -> int:
        job_id = self._next_id
        self._next_id += 1
        self._jobs[job_id] = job
        job.live.jobs.add(job_id)
        return job_id

    def _on_result(self, r: SwapResult) -> None:
        job = self._jobs.pop(r.job_id)
        job.live.jobs.discard(r.job_id)
        failed = r.failed
        for reason in failed.values():
            name = getattr(reason, "value", str(reason))
            self.c.swap_errors[name] = self.c.swap_errors.get(name, 0) + 1
        assert self.mgr is not None
        if job.kind == "load":
            self._verify(job, failed)
            self.mgr.complete_load(job.keys)
            return
        ok = [k for k in job.keys if k not in failed] if failed else job.keys
        if ok:
            self.mgr.complete_store(ok, True)
            self.c.stored_blocks += len(ok)
        if failed:
            self.mgr.complete_store(list(failed), False)
        if job.release is not None:
            self.pages.release(job.release)

    def _verify(self, job: _Job, failed: Mapping[BlockKey, object]) -> None:
        keys, pages = job.keys, job.pages
        if failed:  # the copy failed for some: recompute those, check the others
            mask = np.array([k not in failed for k in keys])
            self.content.fill(pages[~mask], [k for k in keys if k in failed])
            keys = [k for k in keys if k not in failed]
            pages = pages[mask]
        bad = self.content.check(pages, keys)
        if bad:
            raise BenchIntegrityError(self._mismatch(job, keys, bad))
        self.c.verified_blocks += len(keys)
        self.c.verified_bytes += len(keys) * self.block_bytes

    def _mismatch(self, job: _Job, keys: list[BlockKey], bad: list[int]) -> str:
        key = keys[bad[0]]
        position = job.keys.index(key)
        slot = job.slots[position]
        tier = self._promoted_from.get(key)
        where = (
            f"was promoted into the pool from tier '{tier}'"
            if tier is not None
            else "was stored there from the GPU by this run"
        )
        return (
            f"wrong bytes reached the GPU: block {key.hex()} (prompt block {position} of "
            f"request {job.live.req.req_id}), loaded from CPU pool slot {slot}, does not hold "
            f"the bytes stored for its key; the pool's copy {where}. {len(bad)} of "
            f"{len(job.keys)} blocks of this load job are wrong. A tier served bytes it did "
            f"not verify, or a copy went wrong: the run is invalid"
        )

    def _wait_for(self, job_ids: Iterable[int]) -> None:
        """Block until the given swapper jobs ended, handling every result that comes."""
        ids = [j for j in job_ids if j in self._jobs]
        while ids:
            assert self.swap is not None
            if not self.swap.wait(ids, timeout=60.0):
                raise BenchError(f"swapper jobs {ids} did not finish within 60 s")
            for r in self.swap.get_finished():
                self._on_result(r)
            ids = [j for j in ids if j in self._jobs]

    def _alloc(self, n: int) -> np.ndarray:
        pages = self.pages.alloc(n)
        while pages is None:
            if not self._jobs:
                raise BenchError(
                    f"the stand-in GPU KV cache ({self.kv.num_pages} pages) cannot hold the "
                    f"requests in flight: raise --gpu-pages or lower --sessions-in-flight"
                )
            self._wait_for([next(iter(self._jobs))])
            pages = self.pages.alloc(n)
        return pages

    def _drain(self) -> None:
        self._wait_for(list(self._jobs))
        if self.mgr is not None:
            self._step()

    def _settle(self) -> bool:
        """After the clock stops: let the tiers finish the copies the run queued
        (at most `max_wait_s`; the progress bar's clock goes on meanwhile), so that
        the figures count every copy the run sent down, not only those that beat
        its last request - a tier can lag a short run by all of it (a disk busy
        writing back stalls O_DIRECT writes for seconds). False when they did not
        finish in time."""
        if self.mgr is None:
            return True
        end = time.perf_counter() + self.max_wait_s
        done = False
        while not done and time.perf_counter() < end:
            done = self.mgr.drain(timeout=min(SETTLE_STEP_S, end - time.perf_counter()))
            self._absorb(self.mgr.take_events())
            self._report_progress()
        return done

    # ------------------------------------------------------------------ steps

    def _tick(self) -> None:
        if self.swap is not None:
            for r in self.swap.get_finished():
                self._on_result(r)
        if self.mgr is not None:
            self._step()
            if self._waiting:
                self._waiting = [live for live in self._waiting if not self._lookup(live)]
        now = time.perf_counter()
        if now >= self._next_sample:
            self._sample(now)
        if self.progress is not None and now >= self._next_progress:
            self._report_progress()

    def _step(self) -> None:
        assert self.mgr is not None
        self.mgr.step()
        self._absorb(self.mgr.take_events())

    def _absorb(self, events: list[OffloadEvent]) -> None:
        """Follow where the pool's blocks came from: a "stored" event of the pool
        names the tier it was promoted from (`source`), or none for our own stores.
        The secondary tiers' own events say nothing about the pool."""
        promoted, fresh = self._promoted_from, self._fresh
        for ev in events:
            if ev.tier != POOL:
                continue
            if ev.kind == "stored" and ev.source is not None:
                for k in ev.keys:
                    promoted[k] = ev.source
                    fresh[k] = ev.source
            else:  # stored from the GPU, or removed
                for k in ev.keys:
                    promoted.pop(k, None)
                    fresh.pop(k, None)

    def _sample(self, now: float) -> None:
        self._next_sample = now + self.sample_s
        c = self.c
        stats = self.mgr.stats() if self.mgr is not None else None
        swap = self.swap.stats() if self.swap is not None else None
        self.samples.append(
            Sample(
                now - self._t0,
                c.requests,
                c.prompt_tokens,
                dict(c.served_tokens),
                direction_bytes(swap, stats),
            )
        )

    def _report_progress(self) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        self._next_progress = now + 0.1
        self.progress(self.c.requests, now - self._t0, self.c)
