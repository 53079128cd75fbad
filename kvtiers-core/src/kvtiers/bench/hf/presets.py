"""Model shapes for `kvtiers bench --engine hf`: a Llama-architecture decoder built
from a config with random weights (no download, no hub access).

Imports no torch and no transformers: the CLI builds its `--help` from this module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvtiers.contract.namespace import BlockGeometry


@dataclass(frozen=True)
class HfPreset:
    """A decoder's shape; `dtype` is the weights' and the KV cache's."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float
    max_positions: int
    dtype: str
    page_tokens: int = 16

    def with_dtype(self, dtype: str | None) -> HfPreset:
        if dtype is None:
            return self
        out = replace(self, dtype=dtype)
        out.geometry()  # a dtype kvtiers cannot store is refused here, naming the allowed
        return out

    def geometry(self) -> BlockGeometry:
        """The kvtiers block of one page: every layer's K and V of `page_tokens`."""
        return BlockGeometry(self.layers, self.kv_heads, self.head_dim, self.dtype,
                             self.page_tokens)

    def params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.ffn
        return self.layers * (attn + mlp) + 2 * self.vocab * self.hidden

    def llama_config(self) -> Any:
        """transformers' `LlamaConfig` of this shape (imports transformers)."""
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.ffn,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            tie_word_embeddings=False,
        )

    def describe(self) -> str:
        return (
            f"{self.name}: Llama architecture, {self.layers} layers, hidden {self.hidden}, "
            f"{self.heads} heads / {self.kv_heads} kv heads of {self.head_dim}, ffn "
            f"{self.ffn}, vocab {self.vocab}, {_count(self.params())} parameters, "
            f"{self.dtype}, pages of {self.page_tokens} tokens "
            f"({self.geometry().block_bytes / 2**10:,.0f} KiB per kvtiers block)"
        )


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


HF_PRESETS: dict[str, HfPreset] = {
    # Llama-3.1-8B's shape.
    "llama3-8b": HfPreset("llama3-8b", vocab=128256, hidden=4096, layers=32, heads=32,
                          kv_heads=8, head_dim=128, ffn=14336, rope_theta=500000.0,
                          max_positions=131072, dtype="bfloat16"),
    # Small enough for a CPU test in seconds; float32 so the CPU runs it natively.
    "tiny": HfPreset("tiny", vocab=512, hidden=128, layers=3, heads=8, kv_heads=2,
                     head_dim=16, ffn=256, rope_theta=10000.0, max_positions=8192,
                     dtype="float32"),
}
