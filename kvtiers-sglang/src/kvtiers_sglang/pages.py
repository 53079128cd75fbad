"""SGLang's host pool as kvtiers' CPU pool: a `PoolView` over its pages, in place.

SGLang's HiCache host pool (`HostKVCache`: `MHATokenToKVPoolHost`,
`MLATokenToKVPoolHost`) keeps its pages in one tensor, `kv_buffer`. In the page
layouts (`page_first`, `page_first_direct`, `page_head`) each page's K half is one
contiguous run of bytes and its V half another, at the same place in the second half
of the buffer; an MLA page is one run. So the buffer is a pool of blocks of one size
(a half page; an MLA page) that kvtiers tiers read and write in place: slot `p` is
page `p`'s K half (or its MLA page), slot `num_pages + p` its V half. No copy.

`layer_first` scatters a page over every layer, `page_unified` interleaves K and V
inside a page: neither is a run of whole blocks, so they are refused for the
zero-copy (v1) path by name; the generic path (`get`/`set` with SGLang's flat page
tensors) serves every layout through blocks lent for one call (`PagesView.lend`).

Torch is needed here (SGLang's tensors); nothing here does I/O.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from kvtiers import BlockGeometry, PoolView
from kvtiers.sdk import ALIGN, DTYPE_BYTES

#: the layouts whose pages are whole blocks in place (MHA; MLA has no page_head)
ZERO_COPY_LAYOUTS = ("page_first", "page_first_direct", "page_head")
#: the layouts the generic path serves (SGLang gives its pages as flat tensors)
GENERIC_LAYOUTS = ("layer_first", *ZERO_COPY_LAYOUTS)


class LayoutError(ValueError):
    """A host pool kvtiers cannot serve (the message says why and what to change)."""


@dataclass(frozen=True)
class PageShape:
    """What one SGLang page is: `parts` blocks (2: K and V halves; 1: MLA) of
    `block_bytes`, for `page_size` tokens, in `layout`; `geometry` is what the
    namespace records of it."""

    layout: str
    parts: int
    page_size: int
    block_bytes: int
    geometry: BlockGeometry

    @property
    def page_bytes(self) -> int:
        return self.parts * self.block_bytes


def page_shape(host_pool: Any, is_mla: bool) -> PageShape:
    """The page shape of SGLang host pool `host_pool`; `LayoutError` for a layout,
    a dtype or a page size kvtiers cannot serve."""
    layout = str(getattr(host_pool, "layout", ""))
    if layout not in GENERIC_LAYOUTS or (is_mla and layout == "page_head"):
        allowed = [x for x in GENERIC_LAYOUTS if not (is_mla and x == "page_head")]
        raise LayoutError(
            f"SGLang's host pool layout {layout!r} is not supported by kvtiers "
            f"(supported: {', '.join(allowed)}); set --hicache-mem-layout page_first"
        )
    dtype = str(host_pool.dtype).removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise LayoutError(
            f"SGLang's host pool dtype {dtype!r} is not one kvtiers stores "
            f"(supported: {', '.join(sorted(DTYPE_BYTES))})"
        )
    page_size = int(host_pool.page_size)
    layers = int(host_pool.layer_num)
    if is_mla:
        heads, head_dim, parts = 1, int(host_pool.kv_cache_dim), 1
    else:
        heads, head_dim, parts = int(host_pool.head_num), int(host_pool.head_dim), 2
        v_dim = int(getattr(host_pool, "v_head_dim", head_dim))
        if v_dim != head_dim:
            raise LayoutError(
                f"SGLang's host pool has K heads of {head_dim} and V heads of {v_dim} "
                "elements: kvtiers stores pages whose K and V halves have one size"
            )
    geometry = BlockGeometry(layers, heads, head_dim, dtype, page_size)
    block_bytes = layers * page_size * heads * head_dim * DTYPE_BYTES[dtype]
    if block_bytes % ALIGN:
        raise LayoutError(
            f"an SGLang page {'is' if is_mla else 'half is'} {block_bytes} bytes, not a "
            f"multiple of {ALIGN}: kvtiers tiers move 4 KiB-aligned blocks; use a larger "
            "--page-size"
        )
    return PageShape(layout, parts, page_size, block_bytes, geometry)


class PagesView(PoolView):
    """A `PoolView` over SGLang's host pages (slots `0 .. num_slots-1`, in place),
    plus blocks lent for one generic call (slots from `num_slots` on; `lend`,
    `give_back`). Thread-safe: slots are disjoint; lending takes a lock."""

    def __init__(self, buffer: Any, block_bytes: int, *, owner: Any = None):
        super().__init__(buffer, block_bytes, block_bytes)
        self._owner = owner  # keeps the host tensor alive while tiers hold the view
        self._lock = threading.Lock()
        self._lent: dict[int, memoryview] = {}
        self._next = self.num_slots

    @classmethod
    def unbacked(cls, block_bytes: int) -> PagesView:
        """A view with no host pages: every slot is lent (the generic path only)."""
        return cls(mmap.mmap(-1, block_bytes), block_bytes)

    def block(self, slot: int) -> memoryview:
        if 0 <= slot < self.num_slots:
            return super().block(slot)
        try:
            return self._lent[slot]
        except KeyError:
            raise IndexError(f"slot {slot} is neither a host page nor lent") from None

    def lend(self, blocks: Sequence[memoryview]) -> list[int]:
        """Slot numbers for `blocks` (each `block_bytes`), valid until `give_back`."""
        with self._lock:
            first = self._next
            self._next += len(blocks)
            for i, b in enumerate(blocks):
                self._lent[first + i] = b
        return list(range(first, first + len(blocks)))

    def give_back(self, slots: Sequence[int]) -> None:
        with self._lock:
            for slot in slots:
                self._lent.pop(slot, None)

    @property
    def lent(self) -> int:
        """Blocks lent now (a stuck tier's jobs keep theirs)."""
        return len(self._lent)


def host_view(host_pool: Any, shape: PageShape) -> PagesView:
    """The view of `host_pool`'s pages in place; `LayoutError` where the layout
    does not keep whole blocks (use the generic path) or the buffer is unaligned."""
    if shape.layout not in ZERO_COPY_LAYOUTS:
        raise LayoutError(
            f"SGLang's host pool layout {shape.layout!r} spreads a page over every "
            "layer: kvtiers cannot read its pages in place (interface_v1); set "
            "--hicache-mem-layout page_first, or leave interface_v1 out (SGLang then "
            "copies each page)"
        )
    buffer = host_pool.kv_buffer
    if not isinstance(buffer, torch.Tensor) or buffer.device.type != "cpu":
        raise LayoutError("SGLang's host pool has no CPU kv_buffer tensor to read in place")
    if not buffer.is_contiguous():
        raise LayoutError("SGLang's host pool kv_buffer is not contiguous")
    if buffer.data_ptr() % ALIGN:
        raise LayoutError(
            f"SGLang's host pool kv_buffer starts at {buffer.data_ptr():#x}, not on a "
            f"{ALIGN}-byte boundary: kvtiers tiers need aligned pages for O_DIRECT"
        )
    raw = buffer.view(torch.uint8).reshape(-1).numpy()
    if raw.nbytes % (shape.page_bytes):
        raise LayoutError(
            f"SGLang's host pool kv_buffer holds {raw.nbytes} bytes, not whole pages of "
            f"{shape.page_bytes}"
        )
    return PagesView(raw, shape.block_bytes, owner=buffer)


def page_slots(
    host_indices: torch.Tensor, count: int, shape: PageShape, num_pages: int
) -> list[list[int]] | None:
    """The slots of each of `count` pages whose tokens `host_indices` lists (page
    `i`: its `parts` slots); None when the indices are not `count` whole pages
    inside the pool."""
    size = shape.page_size
    flat = host_indices.reshape(-1)
    if flat.numel() != count * size or count == 0:
        return None
    starts = flat[::size].to("cpu", torch.int64)
    if bool((starts % size).any()) or bool((starts < 0).any()):
        return None
    pages = (starts // size).tolist()
    if max(pages) >= num_pages:
        return None
    if shape.parts == 1:
        return [[p] for p in pages]
    return [[p, num_pages + p] for p in pages]
