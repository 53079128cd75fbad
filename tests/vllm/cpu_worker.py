"""The CPU stand-in for vLLM's CUDA offloading worker, for any offloading spec.

`MemcpyWorker` is an `OffloadingWorker` that copies between the "GPU" KV tensors (on
CPU) and the spec's CPU region with plain tensor copies; `cpu_worker_spec(base, name)`
makes a subclass of spec `base` whose `get_worker` returns one, published in this
module so that `spec_name=name, spec_module_path=SPEC_MODULE` loads it.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

SPEC_MODULE = __name__


class MemcpyWorker(OffloadingWorker):
    """vLLM's `OffloadingWorker` on CPU: copies each job when it is submitted, reports
    it finished at the next `get_finished`.

    `cpu_views[t]` is the CPU side of canonical tensor t: (num_chunks, page * bpc) int8.
    Block j of group g in a `GPULoadStoreSpec` is logical block `block_indices[g] + j`
    of its request; a group's chunks follow the previous group's in the CPU spec, the
    first one possibly entered part way (the logical index modulo blocks_per_chunk).
    `loaded` records (gpu block id, group) of every page a load wrote, for the checks.

    On vLLM 0.34 the GPU side comes as `DevicePointers` (one address and size per
    page, group by group, tensor by tensor, block by block): pages are copied at
    those addresses, as vLLM's CUDA worker does, so wrong pointers show as wrong
    bytes.
    """

    def __init__(
        self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, cpu_views: Sequence[torch.Tensor]
    ) -> None:
        self.gpu = [
            t.tensor.view(torch.int8).view(-1, t.page_size_bytes) for t in kv_caches.tensors
        ]
        self.cpu = list(cpu_views)
        if len(self.cpu) != len(self.gpu):
            raise ValueError(f"{len(self.cpu)} CPU views for {len(self.gpu)} KV tensors")
        self.refs = kv_caches.group_data_refs
        self.bpc = blocks_per_chunk
        self._done: list[TransferResult] = []
        self.loaded: list[tuple[int, int]] = []
        self.stored_pages = 0

    def _pairs(
        self, gpu: GPULoadStoreSpec, cpu: LoadStoreSpec
    ) -> Iterator[tuple[int, int, int, int]]:
        """(group, gpu block, cpu chunk, block within the chunk) of every page."""
        assert isinstance(cpu, CPULoadStoreSpec)
        chunks = [int(c) for c in cpu.block_ids]
        blocks = [int(b) for b in gpu.block_ids]
        chunk_at = block_at = 0
        for g, (size, first) in enumerate(zip(gpu.group_sizes, gpu.block_indices, strict=True)):
            if size == 0:
                continue
            skip = first % self.bpc
            for j in range(size):
                yield (
                    g,
                    blocks[block_at + j],
                    chunks[chunk_at + (skip + j) // self.bpc],
                    (skip + j) % self.bpc,
                )
            block_at += size
            chunk_at += (skip + size + self.bpc - 1) // self.bpc
        assert block_at == len(blocks) and chunk_at == len(chunks), (block_at, chunk_at, gpu, cpu)

    def _copy(self, gpu: Any, cpu: LoadStoreSpec, to_cpu: bool) -> int:
        if not isinstance(gpu, GPULoadStoreSpec):
            return self._copy_at_pointers(gpu, cpu, to_cpu)
        copied = 0
        for g, block, chunk, sub in self._pairs(gpu, cpu):
            for ref in self.refs[g]:
                t = ref.tensor_idx
                page = self.gpu[t].shape[1]
                lo = sub * page
                if to_cpu:
                    self.cpu[t][chunk, lo : lo + page] = self.gpu[t][block]
                else:
                    self.gpu[t][block] = self.cpu[t][chunk, lo : lo + page]
                copied += page
            if not to_cpu:
                self.loaded.append((block, g))
            else:
                self.stored_pages += 1
        return copied

    def _copy_at_pointers(self, device: Any, cpu: LoadStoreSpec, to_cpu: bool) -> int:
        """vLLM 0.34's `DevicePointers`: each page copied at its address."""
        assert isinstance(cpu, CPULoadStoreSpec)
        chunks = [int(c) for c in cpu.block_ids]
        ptrs, sizes = device.ptrs, device.sizes
        at = chunk_at = copied = 0
        groups = zip(
            device.group_block_counts,
            device.group_data_ref_counts,
            device.block_indices,
            strict=True,
        )
        for g, (n, n_refs, first) in enumerate(groups):
            if n == 0:
                continue
            assert n_refs == len(self.refs[g])
            skip = first % self.bpc
            for r, ref in enumerate(self.refs[g]):
                host = self.cpu[ref.tensor_idx]
                for j in range(n):
                    size = int(sizes[at + j])
                    sub = (skip + j) % self.bpc
                    page = host[chunks[chunk_at + (skip + j) // self.bpc]]
                    address = page.data_ptr() + sub * size
                    device_address = int(ptrs[at + j])
                    if to_cpu:
                        ctypes.memmove(address, device_address, size)
                    else:
                        ctypes.memmove(device_address, address, size)
                    copied += size
                    if r == 0:  # one page of the group's blocks: recorded once
                        gpu = self.gpu[ref.tensor_idx]
                        block = (device_address - gpu.data_ptr()) // gpu.stride(0)
                        if to_cpu:
                            self.stored_pages += 1
                        else:
                            self.loaded.append((block, g))
                at += n
            chunk_at += (skip + n + self.bpc - 1) // self.bpc
        assert at == len(ptrs) and chunk_at == len(chunks), (at, chunk_at)
        return copied

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: LoadStoreSpec) -> bool:
        start = time.perf_counter()
        size = self._copy(src_spec, dst_spec, to_cpu=True)
        self._done.append(TransferResult(job_id, True, size, time.perf_counter() - start))
        return True

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: Any,
        expedited: bool = False,
    ) -> bool:
        start = time.perf_counter()
        size = self._copy(dst_spec, src_spec, to_cpu=False)
        self._done.append(TransferResult(job_id, True, size, time.perf_counter() - start))
        return True

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every job is complete once submitted

    def shutdown(self) -> None:
        # Drop the views of the shared region, so that its mmap can be closed.
        self.cpu.clear()
        self.gpu.clear()


CpuViews = Callable[[Any, CanonicalKVCaches], list[torch.Tensor]]


def shared_region_views(spec: Any, kv_caches: CanonicalKVCaches) -> list[torch.Tensor]:
    """The worker's views of a `CPUOffloadingSpec`'s shared region (rank 0), one per
    canonical tensor, as vLLM's own worker carves them. The region is kept on the spec
    (`_harness_region`) and released by `Engine.close()`."""
    region = SharedOffloadRegion(
        engine_id=spec.config.engine_id,
        num_chunks=spec.num_chunks,
        rank=spec.config.parallel.rank,
        kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
        cpu_page_size=spec.cpu_page_size_per_worker,
    )
    spec._harness_region = region
    return [
        region.create_next_worker_view(t.page_size_bytes * spec.blocks_per_chunk)
        for t in kv_caches.tensors
    ]


_SPECS: dict[str, type[Any]] = {}


def cpu_worker_spec(
    base: type[OffloadingSpec], name: str, cpu_views: CpuViews = shared_region_views
) -> type[Any]:
    """A subclass `name` of spec `base` whose worker is a `MemcpyWorker`, importable as
    `SPEC_MODULE.<name>` (a kv_transfer_config's spec_name / spec_module_path)."""
    if name in _SPECS:
        if not issubclass(_SPECS[name], base):
            raise ValueError(f"spec {name} already made from {_SPECS[name].__mro__[1]}")
        return _SPECS[name]

    def get_worker(self: Any, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if getattr(self, "_harness_worker", None) is None:
            self._harness_worker = MemcpyWorker(
                kv_caches, self.blocks_per_chunk, cpu_views(self, kv_caches)
            )
        worker: OffloadingWorker = self._harness_worker
        return worker

    cls = type(name, (base,), {"get_worker": get_worker, "__module__": SPEC_MODULE})
    _SPECS[name] = cls
    setattr(sys.modules[SPEC_MODULE], name, cls)
    return cls
