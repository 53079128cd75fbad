"""The model: transformers' `LlamaForCausalLM` built from a preset's config with
random weights (a fixed seed; nothing downloaded), attending through the paged KV
cache (`kvtiers.bench.hf.paged`).

`forward` is one engine step: B sequences, each bringing the same number of new
tokens after what its pages already hold; it returns the logits of the last
`keep` positions. Called from one thread; it does not synchronise the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtiers.bench.hf import paged
from kvtiers.bench.hf.presets import HfPreset
from kvtiers.errors import MissingExtraError
from kvtiers.extras import BENCH_EXTRA, missing_torch

try:
    import torch
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc


HF_EXTRA = "hf"  # kvtiers-core[hf]: torch and transformers


class HfDecoder:
    def __init__(self, preset: HfPreset, device: torch.device, seed: int = 0):
        try:
            from transformers import LlamaForCausalLM
        except ImportError as exc:
            raise MissingExtraError(
                f"kvtiers bench --engine hf needs transformers (5.x), which cannot be "
                f"imported here ({exc}): pip install 'kvtiers-core[{HF_EXTRA}]' (torch "
                f"first, pinned: see the bench extra)", extra=HF_EXTRA, package="transformers",
            ) from exc
        paged.register()
        self.preset = preset
        self.device = device
        config = preset.llama_config()
        config._attn_implementation = paged.ATTENTION
        dtype = getattr(torch, preset.dtype)
        old = torch.get_default_dtype()
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model: Any = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(old)
        self.model = model.eval()

    @torch.inference_mode()
    def forward(self, cache: paged.PagedKV, tokens: Sequence[Sequence[int]],
                starts: Sequence[int], tables: Sequence[torch.Tensor],
                keep: int = 1) -> torch.Tensor:
        """Logits `[B, keep, vocab]` (float32) of the last `keep` new tokens."""
        ids = torch.tensor([list(t) for t in tokens], device=self.device)
        q_len = ids.shape[1]
        offsets = torch.arange(q_len, device=self.device)
        positions = torch.stack([offsets + s for s in starts])
        batch = paged.PagedBatch(cache, tables, starts, q_len)
        with paged.active(batch):
            out = self.model(input_ids=ids, position_ids=positions, use_cache=False,
                             logits_to_keep=keep)
        logits: torch.Tensor = out.logits
        return logits.float()
