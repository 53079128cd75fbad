"""Namespaces: a fingerprint of everything that makes two blocks with one key
incompatible. Persistent tiers store under it; peers refuse to mix namespaces."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

# Bumped whenever the canonical block order, the key format or any tier's on-storage
# format changes. 2: keys end in a 4-byte group index (was 2).
FORMAT_VERSION = 2

# Bytes per element, by the dtype names torch uses (without the "torch." prefix).
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


@dataclass(frozen=True, slots=True)
class BlockGeometry:
    """The canonical shape of one block of one KV-cache group:
    `[tp_size][layers][K, V][tokens_per_block][kv_heads][head_size]` of `dtype`."""

    layers: int
    kv_heads: int
    head_size: int
    dtype: str
    tokens_per_block: int
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(
                f"unknown dtype {self.dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}"
            )
        for name in ("layers", "kv_heads", "head_size", "tokens_per_block", "tp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def block_bytes(self) -> int:
        """Bytes of one block in canonical order, all ranks together."""
        return (
            self.tp_size
            * self.layers
            * 2
            * self.tokens_per_block
            * self.kv_heads
            * self.head_size
            * DTYPE_BYTES[self.dtype]
        )

    @property
    def rank_bytes(self) -> int:
        """Bytes of one rank's part of a block (each rank writes its own part)."""
        return self.block_bytes // self.tp_size


@dataclass(frozen=True, slots=True)
class Namespace:
    """Model identity plus the geometry of every KV group plus the format version."""

    model: str
    groups: tuple[BlockGeometry, ...]
    revision: str = ""
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("namespace needs a model id")
        if not self.groups:
            raise ValueError("namespace needs the geometry of at least one KV group")

    @property
    def fingerprint(self) -> str:
        """32 hex digits, stable across processes, machines and Python versions."""
        doc = {
            "model": self.model,
            "revision": self.revision,
            "format_version": self.format_version,
            "groups": [asdict(g) for g in self.groups],
        }
        blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:32]

    def __str__(self) -> str:
        return f"{self.model}@{self.revision or '-'}/{self.fingerprint[:12]}"
