"""Time to first token per prompt size: recompute against reloads through kvtiers.

For each prompt of N tokens (its last `rest` tokens are the new turn):

1. **recompute**: the whole prompt prefilled from nothing;
2. a first request of the N - rest cached tokens is prefilled and its full pages
   stored through kvtiers (pool, cascaded to the secondary tiers);
3. **resident**: the new turn prefilled with those pages still on the GPU (what
   an engine's own prefix cache would do) - the reference logits;
4. **CPU-pool hit**: other pages are overwritten with random values, the prompt's
   keys are looked up, the hits loaded into those pages through the swapper, and the
   rest prefilled; its logits must equal (`torch.equal`) the resident ones;
5. **fs hit**: the same after the pool was emptied (`manager.reset()`): the blocks
   are promoted from fs first;
6. **partial hit**: a prompt sharing only the first half of the cached tokens.

Every timing is host wall time around device work, synchronised (TTFT = until the
first token's id is known). The copy limit of the same run: pinned copy of the same
bytes + the resident prefill of the rest; the disk limit: those bytes at the disk's
`dd` read speed + the same prefill.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvtiers.bench.engine import PageAllocator
from kvtiers.bench.hf.decoder import HfDecoder
from kvtiers.bench.hf.limits import DiskRead, pinned_copy_s, sync
from kvtiers.bench.hf.offload import Offload, OffloadError
from kvtiers.bench.hf.paged import LAYOUTS, PagedKV
from kvtiers.bench.hf.presets import HfPreset
from kvtiers.extras import BENCH_EXTRA, missing_torch

try:
    import torch
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc


@dataclass
class Breakdown:
    """One request served (partly) from kvtiers: where its TTFT went (seconds)."""

    hash_s: float = 0.0
    lookup_s: float = 0.0
    promote_s: float = 0.0
    swap_in_s: float = 0.0
    prefill_s: float = 0.0
    total_s: float = 0.0
    hit_blocks: int = 0
    promoted_blocks: int = 0


@dataclass
class TtftCase:
    layout: str
    tokens: int
    cached_tokens: int
    kv_bytes: int  # of the cached tokens
    block_bytes: int
    recompute_s: list[float] = field(default_factory=list)
    resident_rest_s: list[float] = field(default_factory=list)
    pool_hits: list[Breakdown] = field(default_factory=list)
    fs_hit: Breakdown | None = None
    partial: Breakdown | None = None
    partial_tokens: int = 0
    copy_s: float = 0.0
    identical_pool: bool = True
    identical_fs: bool | None = None
    identical_partial: bool | None = None
    max_abs_vs_recompute: float = 0.0
    max_abs_logit: float = 0.0  # of the reference logits, for scale
    control_differs: bool | None = None

    # ----------------------------------------------------------- derived

    @property
    def recompute(self) -> float:
        return statistics.median(self.recompute_s)

    @property
    def rest(self) -> float:
        return statistics.median(self.resident_rest_s)

    @property
    def pool_hit(self) -> float:
        return statistics.median(b.total_s for b in self.pool_hits)

    @property
    def copy_limit(self) -> float:
        return self.copy_s + self.rest

    def disk_limit(self, disk: DiskRead | None) -> float | None:
        return None if disk is None else self.kv_bytes / (disk.gbps * 1e9) + self.rest

    def summary(self, disk: DiskRead | None) -> dict[str, Any]:
        gain, limit_gain = self.recompute / self.pool_hit, self.recompute / self.copy_limit
        out: dict[str, Any] = {
            "recompute_s": self.recompute, "pool_hit_s": self.pool_hit,
            "resident_rest_s": self.rest, "copy_s": self.copy_s,
            "copy_GBps": self.kv_bytes / self.copy_s / 1e9 if self.copy_s else None,
            "copy_limit_s": self.copy_limit, "gain": gain, "limit_gain": limit_gain,
            "share_of_limit_gain": gain / limit_gain,
            "swap_in_GBps": self.kv_bytes / statistics.median(
                b.swap_in_s for b in self.pool_hits) / 1e9,
        }
        if self.fs_hit is not None:
            limit = self.disk_limit(disk)
            out.update(fs_hit_s=self.fs_hit.total_s, fs_gain=self.recompute / self.fs_hit.total_s,
                       fs_read_GBps=self.kv_bytes / self.fs_hit.promote_s / 1e9
                       if self.fs_hit.promote_s else None,
                       fs_disk_limit_s=limit,
                       fs_over_disk_limit=self.fs_hit.total_s / limit if limit else None)
        if self.partial is not None:
            out.update(partial_hit_s=self.partial.total_s,
                       partial_gain=self.recompute / self.partial.total_s)
        return out

    def as_dict(self, disk: DiskRead | None) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = self.summary(disk)
        return d


def _timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


class TtftRun:
    """The measurements of one KV layout (one paged cache, one kvtiers stack)."""

    def __init__(self, decoder: HfDecoder, preset: HfPreset, layout: str, num_pages: int,
                 config: dict[str, Any], reps: int, seed: int):
        self.dec, self.p, self.reps, self.seed = decoder, preset, reps, seed
        self.device = decoder.device
        self.cache = PagedKV(preset, num_pages, layout, self.device)
        self.pages = PageAllocator(num_pages)
        self.off = Offload(config, preset, self.cache, seed=seed)
        self.has_fs = "fs" in self.off.tiers
        self.block_bytes = preset.geometry().block_bytes

    def close(self) -> None:
        self.off.close()
        del self.cache

    def _table(self, *parts: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(parts)).to(self.device)

    def _alloc(self, n: int) -> np.ndarray:
        pages = self.pages.alloc(n)
        if pages is None:
            raise OffloadError(f"the paged cache has {self.pages.free} free pages, {n} wanted")
        return pages

    def _first_token(self, tokens: list[int], start: int, table: torch.Tensor
                     ) -> torch.Tensor:
        logits = self.dec.forward(self.cache, [tokens], [start], [table])
        logits[0, -1].argmax().item()  # the first token's id reaches the host
        return logits[0, -1]

    def _reload(self, tokens: list[int], cached: int, pages: np.ndarray, rest_pages: np.ndarray
                ) -> tuple[Breakdown, torch.Tensor]:
        """The hit path: hash, look up (waiting for promotions), load, prefill the rest."""
        t = self.p.page_tokens
        b = Breakdown()
        sync(self.device)
        t0 = time.perf_counter()
        keys = self.off.keys(tokens)
        b.hash_s = time.perf_counter() - t0
        found = self.off.find(keys)
        b.lookup_s, b.promote_s = found.lookup_s, found.promote_s
        b.hit_blocks, b.promoted_blocks = found.hits, found.promoted
        if found.hits * t != cached:
            raise OffloadError(f"{found.hits * t} of {cached} cached tokens were found")
        t1 = time.perf_counter()
        self.off.load(keys[: found.hits], pages)
        sync(self.device)
        t2 = time.perf_counter()
        b.swap_in_s = t2 - t1
        logits = self._first_token(tokens[cached:], cached, self._table(pages, rest_pages))
        sync(self.device)
        t3 = time.perf_counter()
        b.prefill_s, b.total_s = t3 - t2, t3 - t0
        return b, logits

    def measure(self, n: int, rest: int, control: bool) -> TtftCase:
        t = self.p.page_tokens
        if n % t or rest % t or not 0 < rest < n:
            raise ValueError(f"prompt sizes and --rest-tokens must be multiples of the page "
                             f"size ({t}), with 0 < rest < prompt; got {n} and {rest}")
        rng = np.random.default_rng([self.seed, n, LAYOUTS.index(self.cache.kind)])
        tokens = rng.integers(0, self.p.vocab, n).tolist()
        cached = n - rest
        case = TtftCase(self.cache.kind, n, cached, cached // t * self.block_bytes,
                        self.block_bytes)
        dev, reps = self.device, self.reps

        full = self._alloc(n // t)
        table = self._table(full)
        for i in range(reps + 1):  # the first run warms up this shape
            s, logits_full = _timed(dev, lambda: self._first_token(tokens, 0, table))
            if i:
                case.recompute_s.append(s)
        self.pages.release(full)

        first = self._alloc(cached // t)  # the earlier request: prefill, store
        self.dec.forward(self.cache, [tokens[:cached]], [0], [self._table(first)])
        sync(dev)
        self.off.store(self.off.keys(tokens[:cached]), first)
        self.off.wait_stores()
        rest_pages = self._alloc(rest // t)
        resident = self._table(first, rest_pages)
        for i in range(reps + 1):
            s, ref = _timed(dev, lambda: self._first_token(tokens[cached:], cached, resident))
            if i:
                case.resident_rest_s.append(s)
        case.max_abs_vs_recompute = float((logits_full - ref).abs().max())
        case.max_abs_logit = float(ref.abs().max())
        if self.has_fs:
            self.off.drain_cascades()
        case.copy_s = pinned_copy_s(self.off.pool.tensor(), case.kv_bytes, self.p.layers, dev,
                                    reps)

        other = self._alloc(cached // t)
        other_t = torch.from_numpy(other).to(dev)
        for i in range(reps + 1):
            self.cache.scramble(other_t, seed=i)
            b, logits = self._reload(tokens, cached, other, rest_pages)
            case.identical_pool &= bool(torch.equal(logits, ref))
            if i:
                case.pool_hits.append(b)
        if control:  # scrambled and not reloaded: the logits must change
            self.cache.scramble(other_t, seed=99)
            logits = self._first_token(tokens[cached:], cached, self._table(other, rest_pages))
            case.control_differs = not bool(torch.equal(logits, ref))
        if self.has_fs:
            self.off.mgr.reset()  # the pool forgets them: fs serves them
            self.cache.scramble(other_t, seed=7)
            case.fs_hit, logits = self._reload(tokens, cached, other, rest_pages)
            case.identical_fs = bool(torch.equal(logits, ref))
        self.pages.release(first)

        half = cached // t // 2 * t  # a prompt sharing only the first half
        if half:
            tail = rng.integers(0, self.p.vocab, n - half).tolist()
            partial = tokens[:half] + tail
            pages = self._alloc(n // t)
            self.cache.scramble(torch.from_numpy(pages).to(dev), seed=11)
            case.partial, logits = self._reload(partial, half, pages[: half // t],
                                                pages[half // t:])
            case.partial_tokens = half
            again = self._first_token(partial[half:], half, self._table(pages))
            case.identical_partial = bool(torch.equal(logits, again))
            self.pages.release(pages)
        self.pages.release(other)
        self.pages.release(rest_pages)
        return case
