"""The bench's stand-in for an engine's GPU KV cache: a paged cache in an engine's
layout (CUDA memory when there is CUDA, a CPU tensor otherwise), a page allocator,
and the block content helpers (`kvtiers.bench.content`) bound to it.

Layouts (`KVLayout` supports both):

- `layer`: one `[2, pages, tokens, kv_heads, head_size]` tensor per layer (the
  FlashAttention layout), here views of one allocation as many engines keep it;
- `cross`: one `[pages, layers, 2, tokens, kv_heads, head_size]` tensor, a block is
  one contiguous run.
"""

from __future__ import annotations

import numpy as np

from kvtiers.bench.content import BlockContent
from kvtiers.bench.presets import ModelGeometry
from kvtiers.extras import BENCH_EXTRA, missing_torch
from kvtiers.swap import KVLayout

try:
    import torch
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc

LAYOUTS = ("layer", "cross")


class PageAllocator:
    """Free pages as a ring of page ids (FIFO reuse: a freed page is reused as late as
    possible). Vectorised: one numpy operation per call, whatever its size."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._ring = np.arange(num_pages, dtype=np.int64)
        self._head = 0
        self._free = num_pages

    @property
    def free(self) -> int:
        return self._free

    def alloc(self, n: int) -> np.ndarray | None:
        if n > self._free:
            return None
        idx = (self._head + np.arange(n)) % self.num_pages
        pages = self._ring[idx]
        self._head = (self._head + n) % self.num_pages
        self._free -= n
        return pages

    def release(self, pages: np.ndarray) -> None:
        n = len(pages)
        if n + self._free > self.num_pages:
            raise AssertionError("page allocator: more pages released than allocated")
        tail = (self._head + self._free + np.arange(n)) % self.num_pages
        self._ring[tail] = pages
        self._free += n


class StandInKV:
    """`num_pages` pages of `geometry.block_tokens` tokens on `device`, one page per
    kvtiers block."""

    def __init__(
        self,
        geometry: ModelGeometry,
        num_pages: int,
        device: torch.device,
        layout: str = "layer",
        content_seed: int = 0,
    ):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        g = geometry
        dtype = getattr(torch, g.dtype)
        tail = (g.block_tokens, g.kv_heads, g.head_size)
        elems = g.block_tokens * g.kv_heads * g.head_size
        if layout == "layer":
            self.tensor = torch.empty(g.layers, 2, num_pages, *tail, dtype=dtype, device=device)
            views = [self.tensor[i] for i in range(g.layers)]
            self.layout = KVLayout.per_layer(views, kv_first=True)
            fragments = self.tensor.view(2 * g.layers, num_pages, elems)
        else:
            self.tensor = torch.empty(num_pages, g.layers, 2, *tail, dtype=dtype, device=device)
            self.layout = KVLayout.cross_layer(self.tensor)
            fragments = self.tensor.view(num_pages, 2 * g.layers, elems).transpose(0, 1)
        self.tensor.view(torch.uint8).zero_()  # allocated for real, as GPU memory is
        self.kind = layout
        self.device = device
        self.num_pages = num_pages
        self.nbytes = self.tensor.numel() * self.tensor.element_size()
        self.content = BlockContent(fragments, seed=content_seed)
        self.pages = PageAllocator(num_pages)


def stand_in_bytes(geometry: ModelGeometry, num_pages: int) -> int:
    return geometry.block_bytes * num_pages


def pages_for(
    sessions_in_flight: int,
    prefix_tokens: int,
    prompt_tokens: int,
    output_tokens: int,
    turns: int,
    block_tokens: int,
) -> int:
    """Pages the requests in flight can hold at most: each has its whole prompt
    (shared prefix plus every earlier turn) and then its output blocks on the GPU."""
    prompt = prefix_tokens + turns * prompt_tokens + (turns - 1) * output_tokens
    per_request = -(-prompt // block_tokens) + -(-output_tokens // block_tokens) + 2
    return sessions_in_flight * per_request
