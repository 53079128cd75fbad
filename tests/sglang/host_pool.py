"""A stand-in for SGLang's host KV pools (`MHATokenToKVPoolHost`,
`MLATokenToKVPoolHost`), for tests on CPU.

SGLang 0.5.23's real host pool classes cannot be imported on a CPU-only machine with
the `--no-deps` install: `sglang.srt.mem_cache.pool_host` imports the model configs,
which import torchvision's CUDA-built operators. This stand-in has what a storage
backend reads of them - `layout`, `page_size`, `page_num`, `size`, `dtype`,
`layer_num`, `head_num`, `head_dim`, `v_head_dim` (MHA) or `kv_cache_dim` (MLA), and
`kv_buffer` - with `kv_buffer` shaped as SGLang's `init_kv_buffer` shapes it for each
layout and allocated by SGLang's own host allocator (`alloc_mmap`, as SGLang does
on CUDA machines), and SGLang's page accessors (`get_data_page`,
`get_dummy_flat_data_page`, `set_from_flat_data_page`) with SGLang's semantics.
"""

from __future__ import annotations

import torch
from sglang.srt.mem_cache.storage.mmap import alloc_mmap


class HostPool:
    """`pages` pages of `page_size` tokens (SGLang adds one padding page: page_num
    is `pages + 1`)."""

    def __init__(self, *, layout: str = "page_first", pages: int = 16, page_size: int = 16,
                 layers: int = 2, heads: int = 2, head_dim: int = 64,
                 dtype: torch.dtype = torch.bfloat16, mla: bool = False,
                 kv_cache_dim: int = 256):
        self.layout = layout
        self.page_size = page_size
        self.page_num = pages + 1
        self.size = self.page_num * page_size
        self.dtype = dtype
        self.layer_num = layers
        self.is_mla = mla
        if mla:
            self.kv_cache_dim = kv_cache_dim
            self.head_num, self.head_dim = 1, kv_cache_dim
        else:
            self.head_num, self.head_dim, self.v_head_dim = heads, head_dim, head_dim
        self.kv_buffer = alloc_mmap(self._dims(), dtype)

    def _dims(self) -> tuple[int, ...]:
        L, S, P, N, H, D = (self.layer_num, self.size, self.page_size, self.page_num,
                            self.head_num, self.head_dim)
        if self.is_mla:
            return {
                "layer_first": (L, S, 1, D),
                "page_first": (S, L, 1, D),
                "page_first_direct": (N, L, P, 1, D),
            }[self.layout]
        return {
            "layer_first": (2, L, S, H, D),
            "page_first": (2, S, L, H, D),
            "page_first_direct": (2, N, L, P, H, D),
            "page_head": (2, N, H, P, L, D),
        }[self.layout]

    def indices(self, pages: list[int]) -> torch.Tensor:
        """The token indices of host pages `pages`, as SGLang's allocator gives them."""
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size)
                          for p in pages]).to(torch.int64)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        P = self.page_size
        real = index // P
        page: torch.Tensor
        if self.is_mla:
            page = {
                "layer_first": lambda: self.kv_buffer[:, index:index + P],
                "page_first": lambda: self.kv_buffer[index:index + P],
                "page_first_direct": lambda: self.kv_buffer[real:real + 1],
            }[self.layout]()
        else:
            page = {
                "layer_first": lambda: self.kv_buffer[:, :, index:index + P],
                "page_first": lambda: self.kv_buffer[:, index:index + P],
                "page_first_direct": lambda: self.kv_buffer[:, real:real + 1],
                "page_head": lambda: self.kv_buffer[:, real:real + 1],
            }[self.layout]()
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        parts = 1 if self.is_mla else 2
        return torch.zeros(parts * self.layer_num * self.page_size * self.head_num
                           * self.head_dim, dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self.get_data_page(index, flat=False)
        page.copy_(data_page.reshape(page.shape))

    def fill_random(self, gen: torch.Generator) -> None:
        """Random bytes in every page (never zeros)."""
        raw = self.kv_buffer.view(torch.uint8).reshape(-1)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))

    def page_bytes(self, page: int) -> bytes:
        """Page `page`'s bytes, in SGLang's flat page order."""
        data = self.get_data_page(page * self.page_size).contiguous()
        return data.view(torch.uint8).numpy().tobytes()
