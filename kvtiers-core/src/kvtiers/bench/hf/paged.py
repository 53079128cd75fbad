"""The engine's paged KV cache and the attention that reads it.

Pages of `page_tokens` tokens, in either layout the DeviceSwapper supports:

- `layer`: one `[2, pages, page_tokens, kv_heads, head_dim]` tensor per layer (the
  FlashAttention layout), views of one allocation;
- `cross`: one `[pages, layers, 2, page_tokens, kv_heads, head_dim]` tensor, a page
  being one contiguous run for all layers.

A sequence owns the pages of its block table, in order: page `i` holds positions
`i * page_tokens ...`. `paged_attention` is registered with transformers as an
attention implementation (`ATTENTION`): in every layer it writes the new tokens' K
and V into their pages, gathers the sequence's whole K and V back from the pages and
runs torch's scaled-dot-product attention over them, so the logits depend on every
byte of the cached KV. What to attend to comes from `active(batch)`, set around the
forward pass (one thread).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from kvtiers.bench.hf.presets import HfPreset
from kvtiers.extras import BENCH_EXTRA, missing_torch
from kvtiers.swap import KVLayout

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc

ATTENTION = "kvtiers_paged"
LAYOUTS = ("layer", "cross")


class PagedKV:
    """`num_pages` pages on `device` in `layout`; `kv_layout` describes them to the
    DeviceSwapper."""

    def __init__(self, preset: HfPreset, num_pages: int, layout: str, device: torch.device):
        if layout not in LAYOUTS:
            raise ValueError(f"KV layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        p = preset
        dtype = getattr(torch, p.dtype)
        tail = (p.page_tokens, p.kv_heads, p.head_dim)
        self.kind = layout
        self.layers = p.layers
        self.page_tokens = p.page_tokens
        self.num_pages = num_pages
        if layout == "layer":
            self.tensor = torch.zeros(p.layers, 2, num_pages, *tail, dtype=dtype, device=device)
            self.kv_layout = KVLayout.per_layer([self.tensor[i] for i in range(p.layers)],
                                                kv_first=True)
        else:
            self.tensor = torch.zeros(num_pages, p.layers, 2, *tail, dtype=dtype, device=device)
            self.kv_layout = KVLayout.cross_layer(self.tensor)
        self.nbytes = self.tensor.numel() * self.tensor.element_size()

    def plane(self, layer: int, kv: int) -> torch.Tensor:
        """`[pages, page_tokens, kv_heads, head_dim]` of one layer's K (0) or V (1)."""
        return self.tensor[layer, kv] if self.kind == "layer" else self.tensor[:, layer, kv]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, pages: torch.Tensor,
              offsets: torch.Tensor) -> None:
        """Store `k`, `v` (`[tokens, kv_heads, head_dim]`) at `pages`/`offsets`."""
        self.plane(layer, 0)[pages, offsets] = k
        self.plane(layer, 1)[pages, offsets] = v

    def gather(self, layer: int, table: torch.Tensor, length: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the first `length` positions of the sequence whose pages are
        `table`, as `[1, kv_heads, length, head_dim]`."""
        out = []
        for kv in (0, 1):
            pages = self.plane(layer, kv).index_select(0, table)
            flat = pages.view(-1, *pages.shape[2:])[:length]
            out.append(flat.permute(1, 0, 2).unsqueeze(0))
        return out[0], out[1]

    def scramble(self, pages: torch.Tensor, seed: int) -> None:
        """Overwrite `pages` in every layer with random values (never zeros)."""
        gen = torch.Generator(device=self.tensor.device).manual_seed(seed)
        for layer in range(self.layers):
            for kv in (0, 1):
                plane = self.plane(layer, kv)
                shape = (len(pages), *plane.shape[1:])
                noise = torch.randn(shape, generator=gen, device=plane.device,
                                    dtype=torch.float32).to(plane.dtype)
                plane[pages] = noise * 4


@dataclass
class PagedBatch:
    """One forward pass: sequence `b` has `starts[b]` tokens cached in the pages of
    `tables[b]` and brings `q_len` new ones."""

    cache: PagedKV
    tables: Sequence[torch.Tensor]
    starts: Sequence[int]
    q_len: int

    def __post_init__(self) -> None:
        t = self.cache.page_tokens
        self._where = []
        for table, start in zip(self.tables, self.starts, strict=True):
            pos = torch.arange(start, start + self.q_len, device=table.device)
            self._where.append((table[pos // t], pos % t))

    def where(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pages and offsets of sequence `b`'s new tokens."""
        return self._where[b]


_ACTIVE: ContextVar[PagedBatch | None] = ContextVar("kvtiers_paged_batch", default=None)


@contextlib.contextmanager
def active(batch: PagedBatch) -> Iterator[None]:
    token = _ACTIVE.set(batch)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def paged_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                    **_: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: `query` `[B, heads, q, D]`, `key`
    and `value` `[B, kv_heads, q, D]` (the new tokens, RoPE applied); returns
    `[B, q, heads, D]`. The mask transformers built is not used: causality comes
    from the sequence's position."""
    batch = _ACTIVE.get()
    if batch is None:
        raise RuntimeError("paged attention ran outside `kvtiers.bench.hf.paged.active`")
    layer = module.layer_idx
    outs = []
    for b in range(query.shape[0]):
        pages, offsets = batch.where(b)
        batch.cache.write(layer, key[b].transpose(0, 1), value[b].transpose(0, 1), pages,
                          offsets)
        start = batch.starts[b]
        k, v = batch.cache.gather(layer, batch.tables[b], start + query.shape[2])
        outs.append(attend(query[b : b + 1], k, v, start, scaling))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.transpose(1, 2).contiguous(), None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
           scale: float | None) -> torch.Tensor:
    """Causal attention of `q` (positions `start ...`) over `k`, `v` (positions
    `0 ...`), grouped-query: the kernel reads each kv head for its group of heads."""
    n = q.shape[2]
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              enable_gqa=True)
    if n == 1:  # one new token sees every cached one
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    mask = causal_lower_right(n, k.shape[2])
    grouped = q.shape[1] != k.shape[1]
    if grouped and not _LOWER_RIGHT_GQA.get(q.device.type, True):
        return _expanded(q, k, v, mask, scale)
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=grouped)
    except RuntimeError:
        if not grouped:
            raise
        # Some fused kernels behind the lower-right causal bias lack GQA: expand the
        # kv heads for them from now on (same kernel every time, so runs compare).
        _LOWER_RIGHT_GQA[q.device.type] = False
        return _expanded(q, k, v, mask, scale)


_LOWER_RIGHT_GQA: dict[str, bool] = {}


def _expanded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any,
              scale: float | None) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def register() -> None:
    """Make `ATTENTION` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, paged_attention)
