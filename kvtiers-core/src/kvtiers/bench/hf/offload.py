"""kvtiers as an engine embeds it: one `TieringOffloadingManager` (`build_manager`)
over a `CpuPool`, the config's secondary tiers, and a `DeviceSwapper` over the
engine's paged KV cache. Keys are `prefix_block_hashes` of the tokens, one per full
page.

One thread calls everything (the engine's scheduler and worker are one loop here).
`store` returns at once; `load` waits for its copy (the prefill that follows reads
the pages); `lookup` never blocks; `poll` feeds finished copies back to the manager
and runs its `step()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtiers.bench.hf.paged import PagedKV
from kvtiers.bench.hf.presets import HfPreset
from kvtiers.config import load_config
from kvtiers.contract.namespace import Namespace
from kvtiers.errors import KvtiersError
from kvtiers.hashing import prefix_block_hashes
from kvtiers.manager.build import build_manager
from kvtiers.pool import CpuPool
from kvtiers.swap import DeviceSwapper

WAIT_S = 120.0


class OffloadError(KvtiersError):
    """A copy through kvtiers failed or did not finish."""


@dataclass
class Found:
    """What a blocking prefix lookup found, and where its time went."""

    hits: int
    lookup_s: float  # the first lookup_prefix call
    promote_s: float  # waiting (lookups + manager steps) while blocks were promoted
    promoted: int  # blocks that came from a secondary tier


@dataclass
class Loaded(Found):
    """What `find_load` found and loaded: `swap_in_s` is the load time left after
    the last block was found; `early` blocks were swapped in while others were
    still being promoted (their copies hidden behind the promotion)."""

    swap_in_s: float = 0.0
    early: int = 0


class Offload:
    def __init__(self, config: dict[str, Any], preset: HfPreset, cache: PagedKV,
                 seed: int = 0, pin: Any = "auto"):
        geometry = preset.geometry()
        self.page_tokens = preset.page_tokens
        cfg = load_config(config)
        self.pool = CpuPool(geometry.block_bytes, cfg.cpu_bytes_to_use, pin=pin)
        namespace = Namespace(f"kvtiers-bench/hf/{preset.name}", (geometry,),
                              revision=f"random-weights-seed-{seed}")
        try:
            self.mgr = build_manager(cfg, self.pool.view, namespace)
            self.swap = DeviceSwapper(cache.kv_layout, self.pool)
        except BaseException:
            self.pool.close()
            raise
        self.tiers = [t["type"] for t in config.get("secondary_tiers", [])]
        self._next_job = 0
        # job id -> (kind, keys, called with the result when it ends)
        self._jobs: dict[int, tuple[str, list[bytes], Callable[[Any], None] | None]] = {}
        self.stored_blocks = 0

    def close(self) -> None:
        try:
            self.swap.close()
            self.mgr.close()
        finally:
            self.pool.close()

    def keys(self, tokens: list[int]) -> list[bytes]:
        return prefix_block_hashes(tokens, self.page_tokens)

    # ------------------------------------------------------------------ stores

    def store(self, keys: list[bytes], pages: np.ndarray,
              done: Callable[[Any], None] | None = None) -> bool:
        """Offload the pages of `keys` the pool lacks; False if nothing was submitted
        (all present, or the pool cannot take them now). `done(result)` runs in
        `poll` when the copy ended (the pages may be reused from then on)."""
        out = self.mgr.prepare_store(keys)
        if out is None or not out.keys:
            return False
        index = {k: i for i, k in enumerate(keys)}
        job = self._job("store", list(out.keys), done)
        self.swap.submit_store(job, pages[[index[k] for k in out.keys]],
                               np.asarray(out.slots, np.int64), keys=out.keys)
        return True

    def wait_stores(self) -> None:
        """Block until every copy in flight ended, and feed them back."""
        if not self.swap.wait(list(self._jobs), timeout=WAIT_S):
            raise OffloadError("swapper jobs did not finish")
        self.poll()

    def drain_cascades(self) -> None:
        """Block until every block stored so far reached each secondary tier."""
        self.wait_stores()
        deadline = time.monotonic() + WAIT_S
        while True:
            self.mgr.drain(timeout=1.0)
            tiers = self.mgr.stats()["tiers"]
            if all(tiers[t]["cascaded_blocks"] + tiers[t]["cascades_dropped"]
                   + tiers[t]["cascade_failures"] >= self.stored_blocks for t in self.tiers):
                return
            if time.monotonic() > deadline:
                raise OffloadError("cascades to the secondary tiers did not finish")

    # ------------------------------------------------------------------ loads

    def lookup(self, keys: list[bytes]) -> Any:
        return self.mgr.lookup_prefix(keys)

    def find(self, keys: list[bytes]) -> Found:
        """Leading blocks readable from the pool, waiting for promotions (a 1 ms
        sleep and a manager step between lookups)."""
        promoted0 = self.promoted_blocks()
        t0 = time.perf_counter()
        found = self.mgr.lookup_prefix(keys)
        t1 = time.perf_counter()
        deadline = time.monotonic() + WAIT_S
        while found.retry and time.monotonic() < deadline:
            # 1 ms between looks: the tier's I/O threads need the interpreter too.
            time.sleep(1e-3)
            self.mgr.step()
            found = self.mgr.lookup_prefix(keys)
        t2 = time.perf_counter()
        return Found(found.hits, t1 - t0, t2 - t1, self.promoted_blocks() - promoted0)

    def find_load(self, keys: list[bytes], pages: np.ndarray) -> Loaded:
        """`find` and `load` overlapped: leading blocks are swapped into `pages` as
        soon as they are readable (from the pool at once, from a secondary tier as
        its promotions land), while the rest is still promoted. Returns when every
        block found is in `pages`."""
        promoted0 = self.promoted_blocks()
        failed: list[bytes] = []
        jobs: list[int] = []
        loaded = 0

        def submit(upto: int) -> None:
            nonlocal loaded
            if upto > loaded:
                jobs.append(self._submit_load(keys[loaded:upto], pages[loaded:upto], failed))
                loaded = upto

        t0 = time.perf_counter()
        found = self.mgr.lookup_prefix(keys)
        t1 = time.perf_counter()
        deadline = time.monotonic() + WAIT_S
        while found.retry and time.monotonic() < deadline:
            submit(found.hits)
            time.sleep(1e-3)  # as `find`: the tier's I/O threads need the interpreter
            self.poll()
            found = self.mgr.lookup_prefix(keys)
        t2 = time.perf_counter()
        early = loaded
        submit(found.hits)
        if not self.swap.wait(jobs, timeout=WAIT_S):
            raise OffloadError("a load job did not finish")
        self.poll()
        if failed:
            raise OffloadError(f"{len(failed)} of {found.hits} blocks failed to load")
        return Loaded(found.hits, t1 - t0, t2 - t1, self.promoted_blocks() - promoted0,
                      time.perf_counter() - t2, early)

    def _submit_load(self, keys: list[bytes], pages: np.ndarray, failed: list[bytes]) -> int:
        """Pin `keys` (readable now) and start their copy into `pages`; the job id."""
        slots = self.mgr.prepare_load(keys)
        self.mgr.touch(keys)
        job = self._job("load", keys, lambda r: failed.extend(r.failed))
        self.swap.submit_load(job, np.asarray(slots, np.int64), pages, keys=keys)
        return job

    def load(self, keys: list[bytes], pages: np.ndarray) -> None:
        """Copy the blocks of `keys` (all readable now) into `pages`; returns when
        they are there."""
        failed: list[bytes] = []
        job = self._submit_load(keys, pages, failed)
        if not self.swap.wait([job], timeout=WAIT_S):
            raise OffloadError("a load job did not finish")
        self.poll()
        if failed:
            raise OffloadError(f"{len(failed)} of {len(keys)} blocks failed to load")

    # ------------------------------------------------------------------ step

    def poll(self) -> None:
        """Finished copies back to the manager (unpin loads, publish stores), then
        the manager's step (tier jobs collected, promotions and cascades submitted)."""
        for r in self.swap.get_finished():
            kind, keys, done = self._jobs.pop(r.job_id)
            if kind == "load":
                self.mgr.complete_load(keys)
            else:
                self.mgr.complete_store(list(r.ok), True)
                if r.failed:
                    self.mgr.complete_store(list(r.failed), False)
                self.stored_blocks += len(r.ok)
            if done is not None:
                done(r)
        self.mgr.step()

    def pending(self) -> int:
        return len(self._jobs)

    def promoted_blocks(self) -> int:
        tiers = self.mgr.stats()["tiers"]
        return sum(int(tiers[t].get("promoted_hits", 0)) for t in self.tiers)

    def _job(self, kind: str, keys: list[bytes],
             done: Callable[[Any], None] | None) -> int:
        self._next_job += 1
        self._jobs[self._next_job] = (kind, keys, done)
        return self._next_job
