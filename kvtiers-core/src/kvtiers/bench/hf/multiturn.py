"""The multi-turn workload: sessions sharing long prefixes (a system prompt or a
document), several turns each, `concurrency` sessions in flight.

Each turn's prompt is the whole conversation so far plus the user's new tokens. One
engine loop: each step feeds finished copies back to kvtiers, admits new requests
(lookup, load of the hits, one prefill each, the first token sampled), then decodes
one token for every running request in one batched forward pass. A finished request
stores its full pages through kvtiers and frees them when the copy ended; the
session's next turn arrives at once. The same seed gives the same prompts in every
mode; the GPU keeps no prefix of its own between requests, so every reuse goes
through kvtiers (or is recomputed when kvtiers is off).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtiers.bench.engine import PageAllocator
from kvtiers.bench.hf.decoder import HfDecoder
from kvtiers.bench.hf.limits import sync
from kvtiers.bench.hf.offload import Offload, OffloadError
from kvtiers.bench.hf.paged import PagedKV
from kvtiers.bench.hf.presets import HfPreset
from kvtiers.extras import BENCH_EXTRA, missing_torch

try:
    import torch
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc

DEFER_S = 5.0  # a request waits at most this long for promotions, then recomputes


@dataclass(frozen=True)
class Workload:
    sessions: int
    prefixes: int
    prefix_tokens: int
    turns: int
    user_tokens: int
    output_tokens: int
    concurrency: int
    seed: int

    def max_prompt(self) -> int:
        return (self.prefix_tokens + self.turns * self.user_tokens
                + (self.turns - 1) * self.output_tokens)

    def working_set_tokens(self) -> int:
        own = self.turns * (self.user_tokens + self.output_tokens)
        return self.prefixes * self.prefix_tokens + self.sessions * own


@dataclass
class _Request:
    session: int
    prompt: list[int]
    arrival: float
    pages: np.ndarray | None = None
    table: torch.Tensor | None = None
    generated: list[int] = field(default_factory=list)
    keys: list[bytes] | None = None  # hashed once, looked up at every try
    waited_s: float = 0.0


@dataclass
class MultiTurnResult:
    mode: str
    wall_s: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    from_pool_tokens: int = 0
    from_fs_tokens: int = 0
    recomputed_tokens: int = 0
    deferred_requests: int = 0
    # where the engine loop's time went (seconds, summed over requests)
    lookup_s: float = 0.0  # hashing + lookups, waiting ones included
    swap_in_s: float = 0.0
    prefill_s: float = 0.0  # prefill of what was not found, first token sampled
    decode_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    kvtiers_stats: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        t = sorted(self.ttft_s)

        def share(tokens: int) -> float:
            return tokens / self.prompt_tokens if self.prompt_tokens else 0.0

        return {
            "mode": self.mode, "wall_s": self.wall_s, "requests": self.requests,
            "tokens_per_s": (self.prompt_tokens + self.generated_tokens) / self.wall_s,
            "prompt_tokens_per_s": self.prompt_tokens / self.wall_s,
            "generated_tokens_per_s": self.generated_tokens / self.wall_s,
            "requests_per_s": self.requests / self.wall_s,
            "ttft_p50_s": statistics.median(t), "ttft_p90_s": t[int(0.9 * (len(t) - 1))],
            "hit_rate_pool": share(self.from_pool_tokens),
            "hit_rate_fs": share(self.from_fs_tokens),
            "recomputed_share": share(self.recomputed_tokens),
            "deferred_requests": self.deferred_requests,
            "lookup_s": self.lookup_s, "swap_in_s": self.swap_in_s,
            "prefill_s": self.prefill_s, "decode_s": self.decode_s,
        }


def prompts(w: Workload, vocab: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """The shared prefixes and each session's user turns (same seed, same tokens)."""
    rng = np.random.default_rng(w.seed)
    prefixes = [rng.integers(0, vocab, w.prefix_tokens).tolist() for _ in range(w.prefixes)]
    turns = [[rng.integers(0, vocab, w.user_tokens).tolist() for _ in range(w.turns)]
             for _ in range(w.sessions)]
    return prefixes, turns


def run_multiturn(decoder: HfDecoder, preset: HfPreset, layout: str, w: Workload, mode: str,
                  config: dict[str, Any] | None) -> MultiTurnResult:
    """One pass of the workload; `config`: the kvtiers config, None for recompute."""
    t = preset.page_tokens
    device = decoder.device
    per_request = -(-(w.max_prompt() + w.output_tokens) // t)
    # room for the requests in flight and as many again whose pages are being stored
    cache = PagedKV(preset, 2 * w.concurrency * per_request, layout, device)
    pages = PageAllocator(cache.num_pages)
    off = None if config is None else Offload(config, preset, cache, seed=w.seed)
    res = MultiTurnResult(mode)
    prefixes, user = prompts(w, preset.vocab)
    history: dict[int, list[int]] = {}
    turn_of: dict[int, int] = {}
    next_session = 0
    waiting: deque[_Request] = deque()
    running: list[_Request] = []

    def arrive(session: int, now: float) -> None:
        turn = turn_of.get(session, 0)
        base = history.get(session, prefixes[session % w.prefixes])
        waiting.append(_Request(session, base + user[session][turn], now))

    def finish(req: _Request) -> None:
        held = req.pages
        assert held is not None
        history[req.session] = req.prompt + req.generated
        turn_of[req.session] = turn_of.get(req.session, 0) + 1
        stored = False
        if off is not None:  # the KV of everything but the last sampled token
            keys = off.keys(req.prompt + req.generated[:-1])
            # The pages are freed once the copy out of them ended.
            stored = off.store(keys, held[: len(keys)], lambda _r: pages.release(held))
        if not stored:
            pages.release(held)
        if turn_of[req.session] < w.turns:
            arrive(req.session, time.perf_counter())

    try:
        sync(device)
        start = time.perf_counter()
        while next_session < w.sessions or waiting or running:
            if off is not None:
                off.poll()
            while next_session < w.sessions and len(running) + len(waiting) < w.concurrency:
                arrive(next_session, time.perf_counter())
                next_session += 1
            for _ in range(len(waiting)):
                req = waiting.popleft()
                if not _admit(req, decoder, cache, pages, off, res, per_request):
                    waiting.append(req)
                else:
                    running.append(req)
            if not running:  # every request waits for copies: let the tiers' threads run
                time.sleep(200e-6)
                continue
            t0 = time.perf_counter()
            ids = decoder.forward(cache, [[r.generated[-1]] for r in running],
                                  [len(r.prompt) + len(r.generated) - 1 for r in running],
                                  [_table(r) for r in running]).argmax(-1)[:, -1].tolist()
            res.decode_s += time.perf_counter() - t0
            still = []
            for r, tok in zip(running, ids, strict=True):
                r.generated.append(int(tok))
                res.generated_tokens += 1
                if len(r.generated) >= w.output_tokens:
                    finish(r)
                else:
                    still.append(r)
            running = still
        if off is not None:
            off.wait_stores()
        sync(device)
        res.wall_s = time.perf_counter() - start
        if off is not None:
            res.kvtiers_stats = off.mgr.stats()
            # Blocks promoted from a secondary tier were loaded from the pool after.
            fs = min(off.promoted_blocks() * t, res.from_pool_tokens)
            res.from_fs_tokens, res.from_pool_tokens = fs, res.from_pool_tokens - fs
    finally:
        if off is not None:
            off.close()
        del cache
    return res


def _table(req: _Request) -> torch.Tensor:
    assert req.table is not None, "a running request has its pages"
    return req.table


def _admit(req: _Request, decoder: HfDecoder, cache: PagedKV, pages: PageAllocator,
           off: Offload | None, res: MultiTurnResult, per_request: int) -> bool:
    """Look up, load and prefill one request; False to try again next step (a
    promotion or store of its prefix is in flight)."""
    t = cache.page_tokens
    hits = 0
    keys: list[bytes] = []
    if off is not None:
        t0 = time.perf_counter()
        if req.keys is None:
            req.keys = off.keys(req.prompt)
        keys = req.keys
        found = off.lookup(keys)
        res.lookup_s += time.perf_counter() - t0
        if found.retry and time.perf_counter() - req.arrival < DEFER_S:
            if not req.waited_s:
                res.deferred_requests += 1
            req.waited_s = time.perf_counter() - req.arrival
            return False
        hits = min(found.hits, (len(req.prompt) - 1) // t)  # one token is always computed
    got = pages.alloc(per_request)
    if got is None:  # pages still being copied out by stores: wait for them
        if off is None or not off.pending():
            raise OffloadError("the paged cache ran out of pages")
        return False
    req.pages = got
    req.table = torch.from_numpy(got).to(decoder.device)
    t0 = time.perf_counter()
    if off is not None and hits:
        off.load(keys[:hits], got[:hits])
    t1 = time.perf_counter()
    cached = hits * t
    logits = decoder.forward(cache, [req.prompt[cached:]], [cached], [req.table])
    req.generated.append(int(logits[0, -1].argmax()))  # the first token
    t2 = time.perf_counter()
    res.swap_in_s += t1 - t0
    res.prefill_s += t2 - t1
    res.ttft_s.append(t2 - req.arrival)
    res.requests += 1
    res.generated_tokens += 1
    res.prompt_tokens += len(req.prompt)
    res.recomputed_tokens += len(req.prompt) - cached
    res.from_pool_tokens += cached  # the share promoted from fs is moved at the end
    return True
