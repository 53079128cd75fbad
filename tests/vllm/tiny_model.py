"""The tiny model the vLLM tests run: a llama config (no weights), its KV-cache layout
(one group, or two: full attention and a sliding window, as hybrid models have), and
the bytes its "forward" writes into each page (derived from the page's prefix)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    SlidingWindowSpec,
)

BLOCK = 16  # tokens per GPU block, the hash block size too
KV_HEADS = 2
HEAD_SIZE = 16
LAYERS = 2  # layers per KV-cache group
SLIDING_WINDOW = 48  # tokens, for the second group of a hybrid layout
DTYPE = torch.float16
# Bytes of one layer's page: K and V, BLOCK tokens, KV_HEADS x HEAD_SIZE halves.
PAGE = 2 * BLOCK * KV_HEADS * HEAD_SIZE * 2
VOCAB = 1000

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": KV_HEADS * 2 * HEAD_SIZE,
    "intermediate_size": 128,
    "num_attention_heads": KV_HEADS * 2,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_SIZE,
    "num_hidden_layers": LAYERS,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float16",
}


def write_tiny_llama(directory: Path) -> Path:
    """A model directory vLLM's `ModelConfig` accepts: a llama config.json, no weights."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    return directory


# --- the layout ----------------------------------------------------------------------


def layer_name(group: int, layer: int) -> str:
    return f"model.layers.{group * LAYERS + layer}.self_attn.attn"


def kv_cache_config(num_blocks: int, groups: int = 1) -> KVCacheConfig:
    """A hand-built `KVCacheConfig` of `groups` (1 or 2) groups of LAYERS layers.

    Two groups are a hybrid model: full attention and a sliding window of
    SLIDING_WINDOW tokens, overlaying the same allocation the way vLLM lays hybrid
    groups out (a block id belongs to one group at a time).
    """
    if groups not in (1, 2):
        raise ValueError(f"groups must be 1 or 2, not {groups}")
    full = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, dtype=DTYPE
    )
    specs: list[Any] = [full]
    if groups == 2:
        specs.append(
            SlidingWindowSpec(
                block_size=BLOCK,
                num_kv_heads=KV_HEADS,
                head_size=HEAD_SIZE,
                dtype=DTYPE,
                sliding_window=SLIDING_WINDOW,
            )
        )
    size = num_blocks * PAGE * LAYERS
    tensors = [
        KVCacheTensor(
            size=size,
            layers=[layer_name(g, i) for i in range(LAYERS)],
            layer_stride=PAGE * num_blocks,
            block_stride=PAGE,
        )
        for g in range(groups)
    ]
    group_specs = [
        KVCacheGroupSpec([layer_name(g, i) for i in range(LAYERS)], spec)
        for g, spec in enumerate(specs)
    ]
    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=group_specs
    )


def worker_kv_caches(
    num_blocks: int, groups: int
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The "GPU" KV cache on CPU: one (num_blocks, PAGE) int8 tensor per layer index,
    shared by that layer of every group (hybrid groups overlay one allocation)."""
    tensors = [torch.zeros(num_blocks, PAGE, dtype=torch.int8) for _ in range(LAYERS)]
    caches = {layer_name(g, i): tensors[i] for g in range(groups) for i in range(LAYERS)}
    return tensors, caches


def page_bytes(tokens: Sequence[int], end: int, group: int, layer: int) -> np.ndarray:
    """The bytes the "model" writes for the page of `layer` (of `group`) ending at token
    `end`: a function of every token before `end` (a KV page depends on its prefix),
    random-looking, never zeros."""
    digest = hashlib.blake2b(
        np.asarray(tokens[:end], dtype=np.int64).tobytes(),
        digest_size=16,
        person=f"g{group}l{layer}".encode(),
    ).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    data = rng.integers(1, 256, size=PAGE, dtype=np.uint8)  # no zero byte at all
    return data.view(np.int8)
