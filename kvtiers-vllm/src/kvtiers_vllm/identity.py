"""vLLM's run identity as a kvtiers `Namespace`, and vLLM's CPU tier as a `PoolView`.

Two runs share stored blocks in vLLM when their `FileMapper` run config matches:
model, KV dtype, tokens per hash, blocks per chunk, TP/PP/PCP/DCP sizes (collapsed to 1
for a parallelism-agnostic layout), the KV-cache groups (tokens per block, layer
names), the replicated / canonical layout flags. `namespace_for` reads that run config
from vLLM itself (`FileMapper.from_offloading_spec(...).get_run_config()`, the same call
vLLM's fs tier makes) and maps it onto kvtiers' namespace:

- `model`: vLLM's model name;
- `revision`: "vllm-run-<digest>", the digest of the run config that names vLLM's own
  fs directory (`<model>_<digest>`), so equal vLLM identities give equal namespaces,
  and any field vLLM adds to its identity changes the namespace with it;
- `groups`: one `BlockGeometry` per KV-cache group, describing the stored bytes: a
  block is one vLLM chunk (tokens_per_block x blocks_per_chunk tokens, every layer of
  the group, every rank's part). vLLM's config carries the heads and the head size
  only as their product (in the page size), so that product stands as `head_size`
  with `kv_heads` 1; where the bytes do not divide by the dtype, the geometry counts
  bytes (`int8`).

Pure functions of the spec; called once, when the tier is built.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvtiers import BlockGeometry, Namespace, PoolView
from kvtiers.sdk import DTYPE_BYTES

REVISION_PREFIX = "vllm-run-"
DIGEST_CHARS = 12  # as many hex digits as vLLM's fs directory names carry


def run_identity(spec: Any) -> dict[str, Any]:
    """vLLM's run config for `spec` (an `OffloadingSpec`), as its fs tier computes it
    for a parallelism-agnostic store."""
    from vllm.v1.kv_offload.file_mapper import FileMapper

    mapper = FileMapper.from_offloading_spec(
        root_dir="",
        offloading_spec=spec,
        blocks_per_file=spec.blocks_per_chunk,
        parallel_agnostic=True,
    )
    identity: dict[str, Any] = mapper.get_run_config()
    return identity


def run_digest(identity: dict[str, Any]) -> str:
    """The digest vLLM names its fs directory with: SHA-256 of the canonical JSON."""
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:DIGEST_CHARS]


def payload_bytes(spec: Any, row_bytes: int) -> int:
    """Bytes of one chunk row of vLLM's CPU tier that hold data (the rest is padding
    to a page): every worker's part, or the one copy of a replicated layout. The whole
    row for a canonical layout, whose pages vLLM sizes per layer."""
    per_worker = int(getattr(spec, "cpu_page_size_per_worker", 0) or 0)
    if per_worker <= 0 or spec.config.canonical_layout:
        return row_bytes
    copies = 1 if getattr(spec, "replicated_layout", False) else spec.config.parallel.world_size
    return min(row_bytes, per_worker * max(1, copies))


def _geometry(layers: int, tokens: int, block_bytes: int, dtype: str) -> BlockGeometry:
    size = DTYPE_BYTES.get(dtype)
    per_layer_token = 2 * layers * tokens  # K and V of every layer, every token
    if size is not None and block_bytes % (per_layer_token * size) == 0:
        return BlockGeometry(layers, 1, block_bytes // (per_layer_token * size), dtype, tokens)
    if block_bytes % per_layer_token == 0:
        return BlockGeometry(layers, 1, block_bytes // per_layer_token, "int8", tokens)
    return BlockGeometry(1, 1, block_bytes, "int8", 1)  # bytes, nothing more to say


def namespace_for(spec: Any, block_bytes: int) -> Namespace:
    """The kvtiers namespace of vLLM's run identity (see the module doc)."""
    identity = run_identity(spec)
    dtype = str(identity.get("dtype", "")).removeprefix("torch.")
    chunk_blocks = int(spec.blocks_per_chunk)
    groups = tuple(
        _geometry(
            max(1, len(group.layer_names)),
            group.tokens_per_block * chunk_blocks,
            block_bytes,
            dtype,
        )
        for group in spec.config.groups
    )
    return Namespace(
        model=str(identity["model_name"]),
        groups=groups,
        revision=REVISION_PREFIX + run_digest(identity),
    )


def pool_view(primary_kv_view: memoryview, block_bytes: int) -> PoolView:
    """vLLM's CPU tier (a `(num_chunks, row_bytes)` view of its shared region) as the
    pool kvtiers tiers read and write: slot i is chunk i, `block_bytes` of each row."""
    strides = primary_kv_view.strides
    if not strides or primary_kv_view.ndim != 2:
        raise ValueError(
            f"vLLM's primary KV view should be 2-D (chunks, bytes), got shape "
            f"{primary_kv_view.shape}"
        )
    row_bytes = strides[0]
    return PoolView(primary_kv_view, block_bytes, row_bytes)
