"""Where an engine keeps one KV-cache group, and where each engine page's bytes go in
a canonical slot.

The canonical order of a block (DESIGN.md) is `[rank][layer][K, V][token][kv_head]
[head_dim]`. An engine keeps its cache in pages of `page_tokens` tokens, in one of a
few tensor layouts. A `KVLayout` names the axes of the engine's tensors with one
letter each and turns them into **streams**: one per (layer, K/V), in canonical order.
Stream `f` holds, for every page `p`, one *fragment* of `page_bytes` (that page's
`[token][kv_head][head_dim]`, contiguous in canonical order) at

    region[f] + offset[f] + p * page_stride[f]

where a region is the whole storage behind the tensors (several layer tensors may
share one allocation: then a run can span them).

**Pages and blocks.** A kvtiers block is `pages_per_block` engine pages (default 1),
so `tokens_per_block = pages_per_block * page_tokens`. In the slot, the fragment of
stream `f` for the `j`-th page of the block lands at canonical offset
`(f * pages_per_block + j) * page_bytes` of the rank's part. With one page per block
a cross-layer tensor's page is one contiguous run in both places (one copy per
block), and a `[num_pages, 2, ...]` layer's K and V form one run; with several
pages per block the fragments are interleaved, so every fragment is its own run
(unless neighbouring pages happen to be adjacent in the engine's memory too).

**Tensor parallelism.** Each rank describes its own tensors (its local kv heads);
its swapper writes bytes `[rank * rank_bytes, (rank + 1) * rank_bytes)` of a slot.

Letters: `L` layers, `K` the K/V axis (size 2), `P` pages, `T` tokens in a page,
`H` kv heads, `D` head dim. `T`, `H`, `D` must be the last three axes, in that
order and contiguous (`HND` layouts, with heads before tokens, would need a
transposing copy and are refused). The other axes may come in any order and with any
strides (views into a larger allocation are fine).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvtiers.contract.namespace import DTYPE_BYTES, BlockGeometry
from kvtiers.extras import missing_torch

if TYPE_CHECKING:
    import torch

__all__ = ["KVLayout"]

_TAIL = "THD"


@dataclass(frozen=True)
class _Templates:
    """The per-page copy runs of one block position, after merging streams that are
    adjacent both in the engine's memory and in the slot (only possible with one
    page per block). Arrays of length R, in canonical order."""

    region: np.ndarray  # int64
    offset: np.ndarray  # int64, byte offset of page 0's run within the region
    stride: np.ndarray  # int64, page stride in bytes
    canon: np.ndarray  # int64, canonical byte offset of the run for page j == 0
    length: np.ndarray  # int64, bytes


class KVLayout:
    """One KV-cache group of one rank, as the engine holds it.

    Build it with `per_layer` (a list of per-layer tensors, or of `(K, V)` pairs) or
    `cross_layer` (one tensor holding every layer), or `from_tensors` for any other
    axis order. Holds references to the engine's tensors (never copies them).
    """

    def __init__(
        self,
        tensors: Sequence[torch.Tensor | tuple[torch.Tensor, torch.Tensor]],
        order: str,
        *,
        pages_per_block: int = 1,
        tp_size: int = 1,
    ):
        try:
            import torch
        except ImportError as exc:
            raise missing_torch("KVLayout", exc) from exc

        if not isinstance(pages_per_block, int) or pages_per_block < 1:
            raise ValueError(f"pages_per_block must be a positive integer, got {pages_per_block!r}")
        if not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"tp_size must be a positive integer, got {tp_size!r}")
        order = order.upper()
        if len(set(order)) != len(order) or not set(order) <= set("LKPTHD"):
            raise ValueError(f"order {order!r}: use each of the letters L K P T H D at most once")
        if not order.endswith(_TAIL):
            raise ValueError(
                f"order {order!r}: the last three axes must be T H D (tokens, kv heads, "
                f"head dim), contiguous; layouts with heads before tokens are not supported"
            )
        given: list[torch.Tensor | tuple[torch.Tensor, torch.Tensor]] = list(tensors)
        if not given:
            raise ValueError("need at least one KV tensor")
        paired = isinstance(given[0], (tuple, list))
        # Flatten to one list of (tensor, layer index, kv index or None).
        items: list[tuple[torch.Tensor, int, int | None]] = []
        for i, item in enumerate(given):
            if paired:
                if not isinstance(item, (tuple, list)) or len(item) != 2:
                    raise ValueError(f"tensors[{i}]: expected a (K, V) pair")
                items += [(item[0], i, 0), (item[1], i, 1)]
            else:
                if isinstance(item, (tuple, list)):
                    raise ValueError(f"tensors[{i}]: mix of pairs and tensors")
                items.append((item, i, None))
        if paired and "K" in order:
            raise ValueError(f"order {order!r}: K and V come as separate tensors, drop 'K'")
        if not paired and "K" not in order:
            raise ValueError(f"order {order!r} has no K axis: pass (K, V) pairs per layer")
        if "L" in order and len(given) != 1:
            raise ValueError(f"order {order!r} has an L axis: pass exactly one tensor")
        if "P" not in order:
            raise ValueError(f"order {order!r} has no P (pages) axis")

        first = items[0][0]
        self.device: torch.device = first.device
        self.dtype: torch.dtype = first.dtype
        shape = tuple(first.shape)
        if len(shape) != len(order):
            raise ValueError(f"tensor of shape {shape} does not match order {order!r}")
        for t, layer, _ in items:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"layer {layer}: expected a torch.Tensor, got {type(t).__name__}")
            if (t.device, t.dtype, tuple(t.shape)) != (self.device, self.dtype, shape):
                raise ValueError(
                    f"layer {layer}: {tuple(t.shape)} {t.dtype} on {t.device}, but layer 0 "
                    f"is {shape} {self.dtype} on {self.device}: all must match"
                )
        dims = dict(zip(order, shape, strict=True))
        if "K" in dims and dims["K"] != 2:
            raise ValueError(f"the K axis must have size 2 (K, V), got {dims['K']}")
        self.elem_bytes = first.element_size()
        self.page_tokens = dims["T"]
        self.kv_heads = dims["H"]
        self.head_size = dims["D"]
        self.num_pages = dims["P"]
        self.num_layers = dims.get("L", len(given))
        self.pages_per_block = pages_per_block
        self.tp_size = tp_size
        self.order = order
        self.page_bytes = self.page_tokens * self.kv_heads * self.head_size * self.elem_bytes
        self.num_streams = 2 * self.num_layers
        self.rank_bytes = self.num_streams * pages_per_block * self.page_bytes
        self.block_bytes = self.rank_bytes * tp_size
        if self.page_bytes == 0 or self.num_pages == 0:
            raise ValueError(f"empty KV cache: shape {shape}")

        # Regions: one flat uint8 tensor per distinct storage.
        self._regions: list[torch.Tensor] = []
        region_of: dict[int, int] = {}
        region = np.empty(self.num_streams, np.int64)
        offset = np.empty(self.num_streams, np.int64)
        stride = np.empty(self.num_streams, np.int64)
        e = self.elem_bytes
        for t, layer, kv in items:
            st = t.stride()
            ax = {a: i for i, a in enumerate(order)}
            want = (self.kv_heads * self.head_size, self.head_size, 1)
            got = (st[ax["T"]], st[ax["H"]], st[ax["D"]])
            if got != want and t.numel() > 0:
                raise ValueError(
                    f"layer {layer}: the T H D axes must be contiguous (strides {want}), "
                    f"got strides {got}"
                )
            if any(s < 0 for s in st):
                raise ValueError(f"layer {layer}: negative strides are not supported")
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key not in region_of:
                region_of[key] = len(self._regions)
                flat = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
                self._regions.append(flat)
            base = t.data_ptr() - key
            layers = range(self.num_layers) if "L" in ax else [layer]
            kvs = (0, 1) if kv is None else (kv,)
            for lyr in layers:
                for k in kvs:
                    f = 2 * lyr + k
                    off = base
                    if "L" in ax:
                        off += lyr * st[ax["L"]] * e
                    if "K" in ax:
                        off += k * st[ax["K"]] * e
                    region[f] = region_of[key]
                    offset[f] = off
                    stride[f] = st[ax["P"]] * e
        self.stream_region = region
        self.stream_offset = offset
        self.stream_stride = stride
        self.templates = self._make_templates()

    # ---------------------------------------------------------------- builders

    @classmethod
    def per_layer(
        cls,
        kv_caches: Sequence[torch.Tensor | tuple[torch.Tensor, torch.Tensor]],
        *,
        kv_first: bool = True,
        pages_per_block: int = 1,
        tp_size: int = 1,
    ) -> KVLayout:
        """One tensor per layer, `[2, num_pages, page_tokens, kv_heads, head_size]`
        (`kv_first`, FlashAttention's) or `[num_pages, 2, ...]` (FlashInfer's); or one
        `(K, V)` pair per layer, each `[num_pages, page_tokens, kv_heads, head_size]`."""
        caches: list[torch.Tensor | tuple[torch.Tensor, torch.Tensor]] = list(kv_caches)
        if caches and isinstance(caches[0], (tuple, list)):
            order = "PTHD"
        else:
            order = "KPTHD" if kv_first else "PKTHD"
        return cls(caches, order, pages_per_block=pages_per_block, tp_size=tp_size)

    @classmethod
    def cross_layer(
        cls,
        kv_cache: torch.Tensor,
        *,
        order: str = "PLKTHD",
        pages_per_block: int = 1,
        tp_size: int = 1,
    ) -> KVLayout:
        """One tensor for every layer, by default `[num_pages, num_layers, 2,
        page_tokens, kv_heads, head_size]`: a page is one contiguous run."""
        if "L" not in order.upper():
            raise ValueError(f"order {order!r}: a cross-layer tensor needs an L axis")
        return cls([kv_cache], order, pages_per_block=pages_per_block, tp_size=tp_size)

    @classmethod
    def from_tensors(
        cls,
        tensors: Sequence[torch.Tensor | tuple[torch.Tensor, torch.Tensor]],
        order: str,
        *,
        pages_per_block: int = 1,
        tp_size: int = 1,
    ) -> KVLayout:
        return cls(tensors, order, pages_per_block=pages_per_block, tp_size=tp_size)

    # ------------------------------------------------------------------ access

    @property
    def regions(self) -> list[torch.Tensor]:
        """Flat uint8 tensors over the storages behind the engine's tensors."""
        return self._regions

    @property
    def region_addresses(self) -> np.ndarray:
        return np.array([r.data_ptr() for r in self._regions], dtype=np.int64)

    @property
    def runs_per_block(self) -> int:
        """Copy runs per block, before runs of neighbouring blocks are merged."""
        return len(self.templates.length) * self.pages_per_block

    @property
    def tokens_per_block(self) -> int:
        return self.page_tokens * self.pages_per_block

    def geometry(self) -> BlockGeometry:
        """The canonical geometry of this group's blocks (kv heads per rank)."""
        name = str(self.dtype).removeprefix("torch.")
        if name not in DTYPE_BYTES:
            raise ValueError(f"dtype {name} has no canonical name in kvtiers.contract.namespace")
        return BlockGeometry(
            layers=self.num_layers,
            kv_heads=self.kv_heads,
            head_size=self.head_size,
            dtype=name,
            tokens_per_block=self.tokens_per_block,
            tp_size=self.tp_size,
        )

    def describe(self) -> str:
        runs = self.runs_per_block
        return (
            f"{self.order} x{self.num_layers} layers, {self.num_pages} pages of "
            f"{self.page_tokens} tokens ({self.page_bytes} B per fragment), "
            f"{self.pages_per_block} page(s) per block, {runs} run(s) of "
            f"{int(self.templates.length.max())} B max per block, rank part "
            f"{self.rank_bytes} B, tp {self.tp_size}, {len(self._regions)} region(s)"
        )

    def __repr__(self) -> str:
        return f"<KVLayout {self.describe()}>"

    # ---------------------------------------------------------------- internal

    def _make_templates(self) -> _Templates:
        n = self.pages_per_block
        pb = self.page_bytes
        f = np.arange(self.num_streams, dtype=np.int64)
        canon = f * n * pb
        length = np.full(self.num_streams, pb, np.int64)
        region, offset, stride = self.stream_region, self.stream_offset, self.stream_stride
        if n == 1 and self.num_streams > 1:
            # Merge stream f+1 into f's run where it follows f's fragment directly, for
            # every page (same region, same page stride) — in the slot it always does.
            joins = (
                (region[1:] == region[:-1])
                & (stride[1:] == stride[:-1])
                & (offset[1:] == offset[:-1] + pb)
            )
            starts = np.flatnonzero(np.r_[True, ~joins])
            length = np.add.reduceat(length, starts)
            region, offset, stride, canon = (a[starts] for a in (region, offset, stride, canon))
        return _Templates(region.copy(), offset.copy(), stride.copy(), canon.copy(), length)

    def word_bytes(self) -> int:
        """Largest power of two (<= 8) dividing every fragment offset, stride and size:
        the widest word a copy may use."""
        g = math.gcd(
            self.page_bytes,
            int(np.gcd.reduce(self.stream_offset)),
            int(np.gcd.reduce(self.stream_stride)),
        )
        return math.gcd(g, 8) if g else 8
