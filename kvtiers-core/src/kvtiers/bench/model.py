"""A small decoder-only transformer in plain torch with a paged KV cache, for the
model check (`kvtiers.bench.model_check`): random weights from a fixed seed, no
download, a few layers, grouped-query attention, RoPE, RMSNorm, SwiGLU.

Its KV cache is laid out as an engine's (FlashAttention's): one tensor per layer,
`[2, num_pages, page_tokens, kv_heads, head_size]`, and a sequence owns the pages
of its block table, in order. Every forward pass writes the new tokens' K and V into
their pages and reads every earlier token's K and V back from the pages, so the
logits depend on every byte of the cached KV: a page reloaded with different bytes
changes them.

Not fast, not for serving: plain tensor ops, deterministic on CPU with a fixed
thread count and `torch.use_deterministic_algorithms(True)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtiers.contract.namespace import BlockGeometry
from kvtiers.extras import BENCH_EXTRA, missing_torch
from kvtiers.swap import KVLayout

try:
    import torch
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 512
    layers: int = 3
    d_model: int = 128
    heads: int = 8
    kv_heads: int = 2
    head_size: int = 16
    ffn: int = 384
    page_tokens: int = 16
    num_pages: int = 32
    dtype: str = "float32"
    rope_theta: float = 10_000.0
    seed: int = 0

    def describe(self) -> str:
        return (
            f"{self.layers} layers, d_model {self.d_model}, {self.heads} heads / "
            f"{self.kv_heads} kv heads of size {self.head_size}, {self.dtype}, pages of "
            f"{self.page_tokens} tokens"
        )


class TinyDecoder:
    """Weights drawn from `config.seed`; `kv` holds one cache tensor per layer."""

    def __init__(self, config: TinyConfig = TinyConfig(), device: str | torch.device = "cpu"):
        c = self.config = config
        if c.heads % c.kv_heads:
            raise ValueError("heads must be a multiple of kv_heads")
        self.device = torch.device(device)
        self.dtype = getattr(torch, c.dtype)
        gen = torch.Generator().manual_seed(c.seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=gen) / math.sqrt(rows)
            return w.to(self.device, self.dtype)

        def ones() -> torch.Tensor:
            return torch.ones(c.d_model, device=self.device, dtype=self.dtype)

        qd, kvd = c.heads * c.head_size, c.kv_heads * c.head_size
        self.embed = (torch.randn(c.vocab, c.d_model, generator=gen)).to(self.device, self.dtype)
        self.blocks = [
            {
                "attn_norm": ones(),
                "wq": weight(c.d_model, qd),
                "wk": weight(c.d_model, kvd),
                "wv": weight(c.d_model, kvd),
                "wo": weight(qd, c.d_model),
                "mlp_norm": ones(),
                "w_gate": weight(c.d_model, c.ffn),
                "w_up": weight(c.d_model, c.ffn),
                "w_down": weight(c.ffn, c.d_model),
            }
            for _ in range(c.layers)
        ]
        self.final_norm = ones()
        self.lm_head = weight(c.d_model, c.vocab)
        shape = (2, c.num_pages, c.page_tokens, c.kv_heads, c.head_size)
        self.kv = [
            torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in range(c.layers)
        ]
        max_pos = c.num_pages * c.page_tokens
        inv = 1.0 / (
            c.rope_theta ** (torch.arange(0, c.head_size, 2, dtype=torch.float64) / c.head_size)
        )
        angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
        self._cos = angles.cos().to(self.device, self.dtype)
        self._sin = angles.sin().to(self.device, self.dtype)

    # ------------------------------------------------------------------ cache

    def kv_layout(self) -> KVLayout:
        return KVLayout.per_layer(self.kv, kv_first=True)

    def geometry(self) -> BlockGeometry:
        c = self.config
        return BlockGeometry(c.layers, c.kv_heads, c.head_size, c.dtype, c.page_tokens)

    def clear_cache(self) -> None:
        for t in self.kv:
            t.zero_()

    def scramble_pages(self, pages: torch.Tensor, gen: torch.Generator) -> None:
        """Overwrite the K and V of `pages` in every layer with random values."""
        for t in self.kv:
            noise = torch.randn(t[:, pages].shape, generator=gen).to(t.device, t.dtype) * 100
            t[:, pages] = noise

    # ------------------------------------------------------------------ forward

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start: int, block_table: torch.Tensor) -> torch.Tensor:
        """Logits `[len(tokens), vocab]` of `tokens` at positions `start...`, whose
        earlier tokens' KV is in the pages of `block_table` (page i holds positions
        `i * page_tokens ...`). Writes the new tokens' KV into their pages."""
        c = self.config
        n = len(tokens)
        total = start + n
        pos = torch.arange(start, total, device=self.device)
        every = torch.arange(total, device=self.device)
        new_pages, new_slots = block_table[pos // c.page_tokens], pos % c.page_tokens
        all_pages, all_slots = block_table[every // c.page_tokens], every % c.page_tokens
        causal = every[None, :] <= pos[:, None]  # [n, total]
        group = c.heads // c.kv_heads
        x = self.embed[tokens]
        for layer, w in enumerate(self.blocks):
            h = _rms_norm(x, w["attn_norm"])
            q = self._rope((h @ w["wq"]).view(n, c.heads, c.head_size), pos)
            k = self._rope((h @ w["wk"]).view(n, c.kv_heads, c.head_size), pos)
            v = (h @ w["wv"]).view(n, c.kv_heads, c.head_size)
            cache = self.kv[layer]
            cache[0, new_pages, new_slots] = k
            cache[1, new_pages, new_slots] = v
            keys = cache[0, all_pages, all_slots].repeat_interleave(group, dim=1)
            values = cache[1, all_pages, all_slots].repeat_interleave(group, dim=1)
            scores = torch.einsum("nhd,thd->hnt", q, keys) / math.sqrt(c.head_size)
            scores = scores.masked_fill(~causal[None], float("-inf"))
            attn = torch.softmax(scores, dim=-1)
            out = torch.einsum("hnt,thd->nhd", attn, values).reshape(n, c.heads * c.head_size)
            x = x + out @ w["wo"]
            h = _rms_norm(x, w["mlp_norm"])
            x = x + (torch.nn.functional.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
        return _rms_norm(x, self.final_norm) @ self.lm_head

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self._cos[pos][:, None, :], self._sin[pos][:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
