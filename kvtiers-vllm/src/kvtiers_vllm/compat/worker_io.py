"""The device side of an `OffloadingWorker` job, as one description for kvtiers' worker.

vLLM 0.33 hands a worker a `GPULoadStoreSpec`: GPU block ids, group by group
(`group_sizes`), and each group's first logical block (`block_indices`). vLLM 0.34
hands it `DevicePointers` instead: for each group, for each of the group's KV tensors,
for each block, the address of the block's page (`data_ptr() + block_id * stride(0)`
of the canonical tensor) and its size. kvtiers' worker (`DeviceSwapper`) addresses
pages by block id, so `device_blocks` turns either into `DeviceBlocks`; for pointers
it inverts vLLM's formula with the worker's own KV tensors and checks that every
tensor of a group names the same blocks, at full pages (a pointer that is not one of
these tensors' pages raises `ValueError` rather than copying somewhere else).

Pure functions, any thread; O(pages) numpy work per job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from vllm.v1.kv_offload import base as _vllm_base
from vllm.v1.kv_offload.base import CanonicalKVCaches, GPULoadStoreSpec

#: vLLM 0.34's worker argument; None on 0.33.
DevicePointers: type | None = getattr(_vllm_base, "DevicePointers", None)


@dataclass(frozen=True)
class DeviceBlocks:
    """The GPU blocks of one job: `block_ids` concatenated group by group
    (`group_sizes[g]` of group g), `block_indices[g]` the logical index of group g's
    first block in its request."""

    block_ids: np.ndarray  # int64
    group_sizes: tuple[int, ...]
    block_indices: tuple[int, ...]


def device_blocks(device: object, kv_caches: CanonicalKVCaches) -> DeviceBlocks:
    """`device` (a `GPULoadStoreSpec` or `DevicePointers`) as `DeviceBlocks`."""
    if isinstance(device, GPULoadStoreSpec):
        return DeviceBlocks(
            np.asarray(device.block_ids, dtype=np.int64),
            tuple(int(n) for n in device.group_sizes),
            tuple(int(i) for i in device.block_indices),
        )
    if DevicePointers is not None and isinstance(device, DevicePointers):
        return _from_pointers(device, kv_caches)
    raise TypeError(
        f"kvtiers' worker: expected vLLM's GPULoadStoreSpec or DevicePointers, "
        f"got {type(device).__name__}"
    )


def _from_pointers(device: Any, kv_caches: CanonicalKVCaches) -> DeviceBlocks:
    ptrs = np.asarray(device.ptrs, dtype=np.uint64)
    sizes = np.asarray(device.sizes, dtype=np.uint64)
    counts = tuple(int(n) for n in device.group_block_counts)
    ref_counts = tuple(int(n) for n in device.group_data_ref_counts)
    indices = tuple(int(i) for i in device.block_indices)
    groups = kv_caches.group_data_refs
    if len(counts) != len(groups) or len(ref_counts) != len(groups):
        raise ValueError(
            f"kvtiers' worker: device pointers for {len(counts)} KV groups, "
            f"the worker has {len(groups)}"
        )
    parts: list[np.ndarray] = []
    at = 0
    for g, (n, refs_n) in enumerate(zip(counts, ref_counts, strict=True)):
        refs = groups[g]
        if n and refs_n != len(refs):
            raise ValueError(
                f"kvtiers' worker: device pointers name {refs_n} KV tensors in group {g}, "
                f"the worker has {len(refs)}"
            )
        blocks: np.ndarray | None = None
        for ref in refs if n else ():
            tensor = kv_caches.tensors[ref.tensor_idx].tensor
            base = np.uint64(tensor.data_ptr())
            row = tensor.stride(0) * tensor.element_size()
            mine = ptrs[at : at + n]
            offsets = (mine - base).astype(np.int64)  # wraps negative below the base
            ids = offsets // row
            bad = (
                (mine < base)
                | (offsets % row != 0)
                | (ids >= tensor.shape[0])
                | (sizes[at : at + n] != ref.page_size_bytes)
            )
            if bad.any() or (blocks is not None and not np.array_equal(ids, blocks)):
                raise ValueError(
                    f"kvtiers' worker: device pointers of group {g} (KV tensor "
                    f"{ref.tensor_idx}) are not whole pages of the worker's KV cache "
                    f"at the same blocks as the group's other tensors"
                )
            blocks = ids
            at += n
        if blocks is not None:
            parts.append(blocks)
    if at != len(ptrs):
        raise ValueError(
            f"kvtiers' worker: {len(ptrs)} device pointers, the groups account for {at}"
        )
    block_ids = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return DeviceBlocks(block_ids, counts, indices)
