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
   are promoted from fs, each swapped in as soon as it landed in the pool; `reps`
   times, each right after a `dd` O_DIRECT read of the same number of bytes from
   the same filesystem, of cold data (bytes just overwritten and synced, not read
   since);
6. **partial hit**: a prompt sharing only the first half of the cached tokens.

Every timing is host wall time around device work, synchronised (TTFT = until the
first token's id is known). The copy limit of the same run: pinned copy of the same
bytes + the resident prefill of the rest; the disk limit: those bytes at the disk's
`dd` read speed over the run (`run_disk_gbps`: every read taken between the fs hits)
+ the same prefill; each row's own reads are reported beside it.
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
from kvtiers.bench.hf.limits import DiskProbe, DiskRead, median_gbps, pinned_copy_s, sync
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
    promote_s: float = 0.0  # until the last block was readable in the pool
    swap_in_s: float = 0.0  # from then until every block was on the device
    prefill_s: float = 0.0
    total_s: float = 0.0
    hit_blocks: int = 0
    promoted_blocks: int = 0
    early_blocks: int = 0  # swapped in while later blocks were still being promoted


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
    fs_hits: list[Breakdown] = field(default_factory=list)
    disk_reads: list[DiskRead] = field(default_factory=list)  # one before each fs hit
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
    def fs_hit(self) -> Breakdown | None:
        """The fs hit of median TTFT (None without fs)."""
        if not self.fs_hits:
            return None
        return sorted(self.fs_hits, key=lambda b: b.total_s)[len(self.fs_hits) // 2]

    @property
    def copy_limit(self) -> float:
        return self.copy_s + self.rest

    def disk_gbps(self, disk: DiskRead | None) -> float | None:
        """The disk's read speed for this case: the median of the reads taken
        between its fs hits, else `disk` (one read of the run)."""
        if self.disk_reads:
            return median_gbps(self.disk_reads)
        return None if disk is None else disk.gbps

    def disk_limit(self, gbps: float | None) -> float | None:
        """The fs hit's limit: the KV bytes at `gbps` + the prefill of the rest."""
        return None if gbps is None else self.kv_bytes / (gbps * 1e9) + self.rest

    def summary(self, disk: DiskRead | None, run_gbps: float | None = None
                ) -> dict[str, Any]:
        """`run_gbps`: the disk's speed over the run (`run_disk_gbps`), which the fs
        limit uses; without it, this row's (`disk_gbps`)."""
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
        fs = self.fs_hit
        if fs is not None:
            row = self.disk_gbps(disk)
            limit = self.disk_limit(row if run_gbps is None else run_gbps)
            row_limit = self.disk_limit(row)
            promote = statistics.median(b.promote_s for b in self.fs_hits)
            out.update(fs_hit_s=fs.total_s, fs_hit_reps=len(self.fs_hits),
                       fs_gain=self.recompute / fs.total_s,
                       fs_read_GBps=self.kv_bytes / promote / 1e9 if promote else None,
                       disk_GBps=row, disk_run_GBps=run_gbps,
                       disk_reads_GBps=[r.gbps for r in self.disk_reads],
                       fs_disk_limit_s=limit,
                       fs_over_disk_limit=fs.total_s / limit if limit else None,
                       fs_over_row_disk_limit=fs.total_s / row_limit if row_limit else None)
        if self.partial is not None:
            out.update(partial_hit_s=self.partial.total_s,
                       partial_gain=self.recompute / self.partial.total_s)
        return out

    def as_dict(self, disk: DiskRead | None, run_gbps: float | None = None
                ) -> dict[str, Any]:
        d = asdict(self)
        fs = self.fs_hit
        d["fs_hit"] = None if fs is None else asdict(fs)  # the median one
        d["summary"] = self.summary(disk, run_gbps)
        return d


def run_disk_gbps(cases: list[TtftCase], disk: DiskRead | None) -> float | None:
    """The disk's read speed over the run: bytes / seconds of every read taken
    between the fs hits (`disk`, the read at the start, where there are none).

    A virtual disk's speed drifts by more than the fs target's margin from one read to
    the next, seconds apart; the fs hits are spread over the same minutes as these
    reads, so the run's aggregate is the disk they met, where one read next to a hit
    would measure the drift."""
    reads = [r for c in cases for r in c.disk_reads]
    if reads:
        return sum(r.nbytes for r in reads) / sum(r.seconds for r in reads) / 1e9
    return None if disk is None else disk.gbps


def run_fs_gbps(cases: list[TtftCase]) -> float | None:
    """The fs tier's promotion speed over the run: bytes / seconds of every fs hit."""
    seconds = sum(b.promote_s for c in cases for b in c.fs_hits)
    nbytes = sum(c.kv_bytes * len(c.fs_hits) for c in cases)
    return nbytes / seconds / 1e9 if seconds else None


def _timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


class TtftRun:
    """The measurements of one KV layout (one paged cache, one kvtiers stack)."""

    def __init__(self, decoder: HfDecoder, preset: HfPreset, layout: str, num_pages: int,
                 config: dict[str, Any], reps: int, seed: int, probe: DiskProbe | None = None):
        """`probe`: read before each fs hit (the disk limit); none: no disk reads."""
        self.dec, self.p, self.reps, self.seed = decoder, preset, reps, seed
        self.probe = probe
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
        """The hit path: hash, look up (blocks swapped in as they become readable,
        promoted ones as they land), prefill the rest."""
        t = self.p.page_tokens
        b = Breakdown()
        sync(self.device)
        t0 = time.perf_counter()
        keys = self.off.keys(tokens)
        b.hash_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        got = self.off.find_load(keys, pages)
        sync(self.device)
        t2 = time.perf_counter()
        b.lookup_s, b.promote_s = got.lookup_s, got.promote_s
        b.hit_blocks, b.promoted_blocks, b.early_blocks = got.hits, got.promoted, got.early
        b.swap_in_s = t2 - t1 - got.lookup_s - got.promote_s
        if got.hits * t != cached:
            raise OffloadError(f"{got.hits * t} of {cached} cached tokens were found")
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
            case.identical_fs = True
            for i in range(reps):
                if self.probe is not None:  # the disk, just before, the same bytes
                    case.disk_reads.append(self.probe.read(case.kv_bytes))
                self.off.mgr.reset()  # the pool forgets them: fs serves them
                self.cache.scramble(other_t, seed=7 + i)
                b, logits = self._reload(tokens, cached, other, rest_pages)
                case.fs_hits.append(b)
                case.identical_fs &= bool(torch.equal(logits, ref))
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
