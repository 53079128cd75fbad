"""`KvtiersSwapWorker`: kvtiers' `DeviceSwapper` as vLLM's `OffloadingWorker`, for
`KvtiersOffloadingSpec` with `"kvtiers_worker": "kvtiers"`.

It must write vLLM's CPU chunk layout byte for byte (the scheduler side, vLLM's fs
tier and vLLM's own worker all read those bytes). vLLM's row for chunk `c` holds, for
this worker, every canonical KV tensor's page side by side, at
`rank * cpu_page_size + sum(page of the tensors before it)`; `DeviceSwapper` writes a
KV group's layers one after another from `rank * rank_bytes`, each layer's page as
its K half then its V half. The two agree when, for every group:

- one GPU block per chunk (vLLM's `blocks_per_chunk` 1: kvtiers interleaves the
  pages of a multi-page block per layer, vLLM per page);
- the group's layers are the canonical tensors 0..n-1 in order (the usual layout;
  hybrid groups overlaying one allocation share those tensors), all pages of one
  size, unpadded and even (split into its K and V halves);
- with more than one worker, the group covers every tensor (so that a rank's part
  has the same size in both).

Anything else is refused when the worker is built, naming what does not fit and
the way out (`"kvtiers_worker": "vllm"`). The device side of a job comes as vLLM
0.33's block ids or 0.34's device pointers (`compat.worker_io` reads either). Worker
thread only (vLLM's worker calls it from one thread); `submit_*` never block on a copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from kvtiers import DeviceSwapper, KVLayout
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

from kvtiers_vllm.compat.worker_io import device_blocks

_WAY_OUT = 'use "kvtiers_worker": "vllm" (vLLM\'s own worker) for this model'


class LayoutRefused(ValueError):
    """vLLM's chunk layout for these KV caches is one `DeviceSwapper` cannot write."""


class KvtiersSwapWorker(OffloadingWorker):
    """See the module docstring. Owns `region` (released by `shutdown`)."""

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        region: SharedOffloadRegion,
        blocks_per_chunk: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        if blocks_per_chunk != 1:
            raise LayoutRefused(
                f"kvtiers' worker writes one GPU block per CPU chunk; this config puts "
                f"{blocks_per_chunk} in each (block_size / GPU block size), which vLLM "
                f"lays out page by page and kvtiers layer by layer: {_WAY_OUT}"
            )
        rank = region.rank if rank is None else rank
        assert rank is not None, "a worker's region has a rank"
        row = region._row_stride
        world = world_size if world_size is not None else max(1, row // region.cpu_page_size)
        pages = [t.page_size_bytes for t in kv_caches.tensors]
        offsets = np.concatenate(([0], np.cumsum(pages)[:-1])).tolist() if pages else []
        layouts: list[KVLayout] = []
        for g, refs in enumerate(kv_caches.group_data_refs):
            layouts.append(_group_layout(g, refs, kv_caches, pages, offsets, rank, world))
        if world > 1 and any(lay.rank_bytes != region.cpu_page_size for lay in layouts):
            raise LayoutRefused(
                f"with {world} workers each rank's part of a chunk is "
                f"{region.cpu_page_size} bytes, but a KV group covers fewer: {_WAY_OUT}"
            )
        base = region.base_tensor.view(torch.uint8).view(region.num_chunks, row)
        self._region: SharedOffloadRegion | None = region
        self._swapper: DeviceSwapper | None = DeviceSwapper(layouts, base, rank)
        del base  # the swapper's reference is the only one: `shutdown` drops it
        self._groups = len(layouts)
        self._kv_caches = kv_caches  # what device pointers are resolved against
        # vLLM job id -> swapper job ids not reported yet, bytes, seconds, success
        self._jobs: dict[int, list[int]] = {}
        self._totals: dict[int, list[float]] = {}
        self._parent: dict[int, int] = {}
        self._next = 0

    # ---------------------------------------------------------------- contract

    # The device side is vLLM 0.33's `GPULoadStoreSpec` or 0.34's `DevicePointers`
    # (positional: vLLM renamed the parameter).

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: LoadStoreSpec) -> bool:
        return self._submit(job_id, src_spec, dst_spec, store=True)

    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: Any, expedited: bool = False
    ) -> bool:
        return self._submit(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[TransferResult]:
        done: list[TransferResult] = []
        for result in self._live().get_finished():
            parent = self._parent.pop(result.job_id)
            totals = self._totals[parent]
            totals[0] += result.bytes_moved
            totals[1] += result.seconds
            totals[2] = totals[2] and result.success
            pending = self._jobs[parent]
            pending.remove(result.job_id)
            if not pending:
                del self._jobs[parent]
                nbytes, seconds, ok = self._totals.pop(parent)
                done.append(TransferResult(parent, bool(ok), int(nbytes), seconds))
        return done

    def wait(self, job_ids: set[int]) -> None:
        self._live().wait([s for j in job_ids for s in self._jobs.get(j, ())])

    def shutdown(self) -> None:
        """Stop the swapper, then unmap the region. The swapper's views of the
        region go first (with it): a view still exported when vLLM's region closes
        its mapping keeps it mapped (vLLM logs "Keeping ... mapped")."""
        swapper, self._swapper = self._swapper, None
        if swapper is not None:
            swapper.close()
            del swapper
        if self._region is not None:
            self._region.cleanup()
            self._region = None

    # ---------------------------------------------------------------- internal

    def _live(self) -> DeviceSwapper:
        if self._swapper is None:
            raise RuntimeError("KvtiersSwapWorker: used after shutdown")
        return self._swapper

    def _submit(self, job_id: int, device: object, cpu: LoadStoreSpec, *, store: bool) -> bool:
        assert isinstance(cpu, CPULoadStoreSpec)
        swapper = self._live()
        gpu = device_blocks(device, self._kv_caches)
        blocks = gpu.block_ids
        chunks = np.asarray(cpu.block_ids, dtype=np.int64)
        subs: list[int] = []
        self._jobs[job_id] = subs
        self._totals[job_id] = [0.0, 0.0, True]
        at = 0
        for g, size in enumerate(gpu.group_sizes):
            if not size:
                continue
            sub = self._next
            self._next += 1
            subs.append(sub)
            self._parent[sub] = job_id
            # One block per chunk: the group's blocks and chunks pair up in order.
            pages, slots = blocks[at : at + size], chunks[at : at + size]
            if store:
                swapper.submit_store(sub, pages, slots, group=g)
            else:
                swapper.submit_load(sub, slots, pages, group=g)
            at += size
        if not subs:  # nothing to copy: report it at the next poll
            sub = self._next
            self._next += 1
            subs.append(sub)
            self._parent[sub] = job_id
            empty = np.empty(0, np.int64)
            swapper.submit_store(sub, empty, empty, group=0)
        return True


def _group_layout(
    g: int,
    refs: list[CanonicalKVCacheRef],
    kv_caches: CanonicalKVCaches,
    pages: list[int],
    offsets: list[int],
    rank: int,
    world: int,
) -> KVLayout:
    """Group `g`'s layers as a `KVLayout` that puts each page where vLLM does."""
    if not refs:
        raise LayoutRefused(f"KV group {g} has no layers to offload: {_WAY_OUT}")
    page = refs[0].page_size_bytes
    tensors = []
    for i, ref in enumerate(refs):
        t = ref.tensor_idx
        full = pages[t]
        if ref.page_size_bytes != full or full != page or full % 2:
            raise LayoutRefused(
                f"KV group {g}, layer {i}: page of {ref.page_size_bytes} bytes in a "
                f"{full}-byte slot (the group's first: {page}); kvtiers needs equal, "
                f"unpadded pages of K and V halves: {_WAY_OUT}"
            )
        if offsets[t] != i * page:
            raise LayoutRefused(
                f"KV group {g}, layer {i} is vLLM's KV tensor {t}, at byte {offsets[t]} "
                f"of a chunk; kvtiers would put it at byte {i * page} (a group's layers "
                f"must be the first tensors, in order): {_WAY_OUT}"
            )
        gpu = kv_caches.tensors[t].tensor.view(torch.int8)
        rows = gpu.shape[0]
        stride = gpu.stride(0) * gpu.element_size()
        half = page // 2
        # A page as [K, V][1 token][1 head][half bytes]: byte-exact, whatever the
        # real token and head shapes are inside it.
        tensors.append(
            torch.as_strided(gpu, (rows, 2, 1, 1, half), (stride, half, half, half, 1))
        )
    return KVLayout.from_tensors(tensors, "PKTHD", tp_size=world if world > 1 else 1)
