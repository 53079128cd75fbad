"""Engine KV caches in every supported layout, filled with random bytes, and an
independent reference of the canonical slot order (plain indexing, a loop per block:
slow and obviously right)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from kvtiers.swap import KVLayout

KINDS = ("kv_first", "page_first", "pairs", "cross", "cross_lkp", "views_of_cross")


@dataclass
class Engine:
    kind: str
    layout: KVLayout
    tensors: Sequence[object]  # what the layout was built from (keeps the memory alive)
    # fragment(layer, kv, page) -> uint8 view of that page's [T, H, D] bytes
    fragment: Callable[[int, int, int], torch.Tensor]
    backing: list[torch.Tensor]  # every tensor whose bytes make up the cache

    @property
    def num_pages(self) -> int:
        return self.layout.num_pages

    def fill_random(self, gen: torch.Generator) -> None:
        for t in self.backing:
            b = t.view(torch.uint8) if t.dtype != torch.uint8 else t
            # 1..255: random, never zero, so a zeroed (unwritten) byte shows.
            b.copy_(torch.randint(1, 256, b.shape, dtype=torch.uint8, generator=gen).to(b.device))

    def poison(self, value: int = 0) -> None:
        for t in self.backing:
            (t.view(torch.uint8) if t.dtype != torch.uint8 else t).fill_(value)

    def snapshot(self) -> list[torch.Tensor]:
        return [t.view(torch.uint8).clone() for t in self.backing]

    def page_bytes_of(self, page: int) -> torch.Tensor:
        """Every fragment of one page, in canonical (layer, K/V) order."""
        parts = [
            self.fragment(layer, kv, page).reshape(-1)
            for layer in range(self.layout.num_layers)
            for kv in (0, 1)
        ]
        return torch.cat(parts)

    def block_bytes_of(self, pages: list[int]) -> torch.Tensor:
        """A block's rank part in canonical order: [layer][K, V][pages' tokens]..."""
        parts = [
            self.fragment(layer, kv, p).reshape(-1)
            for layer in range(self.layout.num_layers)
            for kv in (0, 1)
            for p in pages
        ]
        return torch.cat(parts)


def make_engine(
    kind: str,
    *,
    layers: int = 3,
    pages: int = 12,
    tokens: int = 4,
    heads: int = 2,
    head_size: int = 8,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    pages_per_block: int = 1,
    tp_size: int = 1,
) -> Engine:
    shape = (tokens, heads, head_size)

    def u8(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(torch.uint8) if t.is_contiguous() else _u8_view(t)

    if kind == "kv_first":
        ts = [torch.empty(2, pages, *shape, dtype=dtype, device=device) for _ in range(layers)]
        layout = KVLayout.per_layer(
            ts, kv_first=True, pages_per_block=pages_per_block, tp_size=tp_size
        )
        return Engine(kind, layout, ts, lambda lyr, kv, p: u8(ts[lyr][kv, p]), ts)
    if kind == "page_first":
        ts = [torch.empty(pages, 2, *shape, dtype=dtype, device=device) for _ in range(layers)]
        layout = KVLayout.per_layer(
            ts, kv_first=False, pages_per_block=pages_per_block, tp_size=tp_size
        )
        return Engine(kind, layout, ts, lambda lyr, kv, p: u8(ts[lyr][p, kv]), ts)
    if kind == "pairs":
        pairs = [
            (torch.empty(pages, *shape, dtype=dtype, device=device),
             torch.empty(pages, *shape, dtype=dtype, device=device))
            for _ in range(layers)
        ]  # fmt: skip
        layout = KVLayout.per_layer(pairs, pages_per_block=pages_per_block, tp_size=tp_size)
        flat = [t for pair in pairs for t in pair]
        return Engine(kind, layout, pairs, lambda lyr, kv, p: u8(pairs[lyr][kv][p]), flat)
    if kind == "cross":
        t = torch.empty(pages, layers, 2, *shape, dtype=dtype, device=device)
        layout = KVLayout.cross_layer(t, pages_per_block=pages_per_block, tp_size=tp_size)
        return Engine(kind, layout, [t], lambda lyr, kv, p: u8(t[p, lyr, kv]), [t])
    if kind == "cross_lkp":
        t = torch.empty(layers, 2, pages, *shape, dtype=dtype, device=device)
        layout = KVLayout.cross_layer(
            t, order="LKPTHD", pages_per_block=pages_per_block, tp_size=tp_size
        )
        return Engine(kind, layout, [t], lambda lyr, kv, p: u8(t[lyr, kv, p]), [t])
    if kind == "views_of_cross":
        # One cross-layer allocation seen through per-layer [2, pages, ...] views, as an
        # engine that keeps per-layer attention code but a contiguous-per-page buffer.
        buf = torch.empty(pages, layers, 2, *shape, dtype=dtype, device=device)
        views = [buf[:, lyr].transpose(0, 1) for lyr in range(layers)]
        layout = KVLayout.per_layer(
            views, kv_first=True, pages_per_block=pages_per_block, tp_size=tp_size
        )
        return Engine(kind, layout, views, lambda lyr, kv, p: u8(buf[p, lyr, kv]), [buf])
    raise ValueError(kind)


def _u8_view(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def random_pool(
    num_slots: int, slot_bytes: int, gen: torch.Generator, pin: bool = False
) -> torch.Tensor:
    pool = torch.empty(num_slots, slot_bytes, dtype=torch.uint8, pin_memory=pin)
    pool.copy_(torch.randint(0, 256, pool.shape, dtype=torch.uint8, generator=gen))
    return pool
