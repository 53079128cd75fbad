"""Model geometries for `kvtiers bench`: the shape of the KV cache that the replay
moves, and what a token of prefill costs on the GPU.

A geometry is what `BlockGeometry` needs (layers, kv heads, head size, dtype, tokens
per block) plus a parameter count, used only to estimate the prefill work that a
served block saves: about 2 FLOPs per parameter per token (the matmuls; attention's
own FLOPs are left out, which understates long prompts).

Imports no torch: the CLI builds its `--help` from this module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from kvtiers.contract.namespace import DTYPE_BYTES, BlockGeometry

# Sustained bf16 throughput assumed for the prefill estimate: about 40% of an
# H100/H200's dense peak (989 TFLOP/s), a usual prefill utilisation.
DEFAULT_GPU_TFLOPS = 400.0


@dataclass(frozen=True)
class ModelGeometry:
    """One KV-cache group's geometry, as the bench uses it. `params`: the model's
    parameter count (None: estimated from the geometry, see `param_count`)."""

    name: str
    layers: int
    kv_heads: int
    head_size: int
    dtype: str = "bfloat16"
    block_tokens: int = 16
    params: float | None = None
    description: str = ""

    def __post_init__(self) -> None:
        self.block_geometry()  # validates every field

    def block_geometry(self) -> BlockGeometry:
        return BlockGeometry(
            layers=self.layers,
            kv_heads=self.kv_heads,
            head_size=self.head_size,
            dtype=self.dtype,
            tokens_per_block=self.block_tokens,
        )

    @property
    def block_bytes(self) -> int:
        return self.block_geometry().block_bytes

    @property
    def bytes_per_token(self) -> int:
        return self.block_bytes // self.block_tokens

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def param_count(self) -> tuple[float, str]:
        """(parameters, where the number comes from)."""
        if self.params is not None:
            return float(self.params), f"{self.name}'s parameter count"
        # Unknown model: a Llama-like decoder with 4 query heads per kv head, so the
        # hidden size is 4 * kv_heads * head_size; ~12 * hidden^2 per layer (attention
        # 4 h^2 with full heads, SwiGLU MLP ~8 h^2), embeddings left out.
        hidden = 4 * self.kv_heads * self.head_size
        return 12.0 * self.layers * hidden * hidden, (
            f"estimated as 12 x layers x hidden^2 with hidden = 4 x kv_heads x head_size "
            f"= {hidden} (pass --params for the real count)"
        )

    def describe(self) -> str:
        return (
            f"{self.name}: {self.layers} layers, {self.kv_heads} kv heads, head size "
            f"{self.head_size}, {self.dtype}, {self.block_tokens} tokens per block "
            f"= {_human(self.block_bytes)} blocks"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "block_bytes": self.block_bytes}


@dataclass(frozen=True)
class PrefillCost:
    """Seconds of GPU prefill per recomputed prompt token, and how it was derived."""

    seconds_per_token: float
    source: str

    @classmethod
    def estimate(
        cls, geometry: ModelGeometry, gpu_tflops: float = DEFAULT_GPU_TFLOPS
    ) -> PrefillCost:
        params, where = geometry.param_count()
        flops = 2.0 * params
        return cls(
            flops / (gpu_tflops * 1e12),
            f"estimate: 2 x {params / 1e9:.2f} B params = {flops / 1e9:.1f} GFLOP per token "
            f"({where}) at {gpu_tflops:g} TFLOP/s sustained",
        )

    @classmethod
    def given(cls, us_per_token: float) -> PrefillCost:
        return cls(
            us_per_token * 1e-6, f"given: {us_per_token:g} us per token (--prefill-us-per-token)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"seconds_per_token": self.seconds_per_token, "source": self.source}


PRESETS: dict[str, ModelGeometry] = {
    g.name: g
    for g in (
        ModelGeometry(
            "llama3-8b",
            32,
            8,
            128,
            "bfloat16",
            16,
            8.03e9,
            "Llama-3-8B-like: 32 layers, GQA 8 kv heads, 128 KiB per token, 2 MiB blocks",
        ),
        ModelGeometry(
            "llama3-70b",
            80,
            8,
            128,
            "bfloat16",
            16,
            70.6e9,
            "Llama-3-70B-like: 80 layers, 320 KiB per token, 5 MiB blocks",
        ),
        ModelGeometry(
            "qwen2.5-7b",
            28,
            4,
            128,
            "bfloat16",
            16,
            7.62e9,
            "Qwen2.5-7B-like: 28 layers, 4 kv heads, 56 KiB per token",
        ),
        ModelGeometry(
            "small",
            8,
            4,
            64,
            "bfloat16",
            16,
            0.35e9,
            "a small model: 8 layers, 4 kv heads, head size 64, 128 KiB blocks",
        ),
        ModelGeometry(
            "tiny",
            2,
            2,
            32,
            "bfloat16",
            16,
            0.01e9,
            "for tests: 2 layers, 2 kv heads, head size 32, 8 KiB blocks",
        ),
    )
}

DEFAULT_PRESET = "llama3-8b"


def geometry_from(
    preset: str | None = None,
    *,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_size: int | None = None,
    dtype: str | None = None,
    block_tokens: int | None = None,
    params: float | None = None,
) -> ModelGeometry:
    """A preset (default `llama3-8b`) with any explicitly given field replacing its
    own; a changed geometry is named `custom` and, unless `params` is given, its
    parameter count is estimated."""
    name = preset or DEFAULT_PRESET
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}")
    base = PRESETS[name]
    changes: dict[str, Any] = {
        k: v
        for k, v in dict(
            layers=layers,
            kv_heads=kv_heads,
            head_size=head_size,
            dtype=dtype,
            block_tokens=block_tokens,
        ).items()
        if v is not None and v != getattr(base, k)
    }
    if changes:
        base = replace(
            base,
            name=f"custom ({name} with " + ", ".join(f"{k}={v}" for k, v in changes.items()) + ")",
            params=None,
            description="",
            **changes,
        )
    if params is not None:
        base = replace(base, params=params)
    return base


def _human(n: int) -> str:
    from kvtiers.humanize import format_bytes

    return format_bytes(n)
