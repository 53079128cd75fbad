"""vLLM's real scheduler and offloading connector, driven in one process on CPU.

`Engine` puts together what a vLLM engine core and one worker would hold: the real
`Scheduler` (which builds the scheduler-role `OffloadingConnector` itself), a
worker-role `OffloadingConnector` over KV tensors on CPU, and an offloading spec whose
`get_worker` is replaced by `MemcpyWorker`, a CPU memcpy `OffloadingWorker` over the
spec's shared CPU region (vLLM's own worker needs CUDA). `Engine.step()` runs the
sequence of one engine step (schedule, bind metadata, loads, "forward", save, finished,
`update_from_output`); the "forward" fills each page a step completes with bytes derived
from the tokens it covers (`page_bytes`: random-looking, never zeros), and every page a
load writes is checked against those bytes the step it lands (`Engine.pages_checked`).

Any spec works: `cpu_worker_spec(base, name)` (tests/vllm/cpu_worker.py, re-exported
here) makes (once) a subclass of `base` with the memcpy worker and publishes it, so a
kv_transfer_config names it with `spec_name=name, spec_module_path=SPEC_MODULE`. A
spec whose CPU region is not the `SharedOffloadRegion` of `CPUOffloadingSpec` passes
its own `cpu_views`.

Everything runs on the calling thread; vLLM's tiering manager may run its tier-poll
thread, which `Engine.close()` stops through the connector's shutdown.
"""

from __future__ import annotations

import glob
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_offload.base import (
    GPULoadStoreSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from .cpu_worker import (
    SPEC_MODULE,
    CpuViews,
    MemcpyWorker,
    cpu_worker_spec,
    shared_region_views,
)
from .tiny_model import (
    BLOCK,
    DTYPE,
    HEAD_SIZE,
    KV_HEADS,
    LAYERS,
    PAGE,
    SLIDING_WINDOW,
    TINY_LLAMA,
    VOCAB,
    kv_cache_config,
    layer_name,
    page_bytes,
    worker_kv_caches,
    write_tiny_llama,
)
from .vllm_compat import model_runner_output

__all__ = [
    "BLOCK",
    "DTYPE",
    "HEAD_SIZE",
    "KV_HEADS",
    "LAYERS",
    "PAGE",
    "SLIDING_WINDOW",
    "TINY_LLAMA",
    "VOCAB",
    "layer_name",
    "worker_kv_caches",
    "SPEC_MODULE",
    "CpuViews",
    "Engine",
    "MemcpyWorker",
    "RecordingPublisher",
    "StepResult",
    "cpu_worker_spec",
    "kv_cache_config",
    "new_engine_id",
    "page_bytes",
    "remove_shm",
    "shared_region_views",
    "status",
    "vllm_config",
    "write_tiny_llama",
]

# --- the engine ----------------------------------------------------------------------


def new_engine_id() -> str:
    return f"kvt{uuid.uuid4().hex[:12]}"


def remove_shm(engine_id: str) -> None:
    for path in glob.glob(f"/dev/shm/vllm_offload_{engine_id}*"):
        os.unlink(path)


def vllm_config(
    model_dir: Path,
    extra_config: Mapping[str, Any],
    engine_id: str,
    num_blocks: int,
    *,
    enable_events: bool = False,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 512,
) -> VllmConfig:
    """A `VllmConfig` for the tiny model on CPU with vLLM's OffloadingConnector."""
    from vllm.config import KVEventsConfig

    model = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype="float16", max_model_len=4096
    )
    vc = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=4096,
            is_encoder_decoder=False,
        ),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            engine_id=engine_id,
            kv_connector_extra_config=dict(extra_config),
        ),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=enable_events, publisher="null")
        if enable_events
        else None,
    )
    vc.cache_config.num_gpu_blocks = num_blocks
    return vc


@dataclass
class StepResult:
    output: SchedulerOutput
    finished: set[str] = field(default_factory=set)  # requests finished this step
    loaded_pages: int = 0  # pages loads wrote this step (every one checked)


class Engine:
    """A scheduler and one worker of vLLM, in this process, on CPU.

    `extra_config` is the connector's kv_connector_extra_config; it must name a spec
    made by `cpu_worker_spec` (the memcpy worker). Requests get token ids, generate
    `max_tokens` tokens (derived from their length: deterministic), and are checked:
    every page a load writes must hold `page_bytes` of its tokens.
    """

    def __init__(
        self,
        model_dir: Path,
        extra_config: Mapping[str, Any],
        *,
        engine_id: str | None = None,
        num_blocks: int = 64,
        groups: int = 1,
        enable_events: bool = False,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 512,
    ) -> None:
        self.engine_id = engine_id or new_engine_id()
        self.groups = groups
        self.num_blocks = num_blocks
        self.config = vllm_config(
            model_dir,
            extra_config,
            self.engine_id,
            num_blocks,
            enable_events=enable_events,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        self.kv_cache_config = kv_cache_config(num_blocks, groups)
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(BLOCK, sha256)
        self.pages_checked = 0
        self.pages_written = 0
        self.steps = 0
        self.preempted: set[str] = set()  # requests the scheduler preempted, ever
        self.events: list[Any] = []  # the KV events vLLM published (BlockStored, ...)
        self.stats: list[dict[str, Any]] = []  # connector stats payloads, one a step
        self._closed = False
        with set_current_vllm_config(self.config):
            self.scheduler = Scheduler(
                vllm_config=self.config,
                kv_cache_config=self.kv_cache_config,
                structured_output_manager=StructuredOutputManager(self.config),
                block_size=BLOCK,
                log_stats=True,
            )
            self.scheduler.kv_event_publisher = RecordingPublisher(self.events)
            self.worker_connector = OffloadingConnector(
                self.config, KVConnectorRole.WORKER, self.kv_cache_config
            )
            self.gpu, caches = worker_kv_caches(num_blocks, groups)
            self.worker_connector.register_kv_caches(caches)

    # -- accessors --

    @property
    def connector(self) -> OffloadingConnector:
        """The scheduler-role connector the scheduler built."""
        connector = self.scheduler.connector
        assert isinstance(connector, OffloadingConnector)
        return connector

    @property
    def worker_spec(self) -> Any:
        """The worker-role connector's spec (the scheduler's connector builds its own
        instance of the same class, which vLLM does not keep: reach it through the
        manager or its tiers)."""
        connector_worker = self.worker_connector.connector_worker
        assert connector_worker is not None
        return connector_worker.spec

    @property
    def manager(self) -> Any:
        """The spec's scheduler-side OffloadingManager."""
        return self.connector.scheduler.manager

    @property
    def worker(self) -> MemcpyWorker:
        worker = self._spec_worker()
        assert isinstance(worker, MemcpyWorker)
        return worker

    def _spec_worker(self) -> Any:
        connector_worker = self.worker_connector.connector_worker
        assert connector_worker is not None
        return connector_worker.worker

    # -- requests --

    def add(
        self,
        request_id: str,
        tokens: Sequence[int],
        max_tokens: int = 1,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> Request:
        """A request; `kv_transfer_params` reach the connector as vLLM's API server
        passes them (`SamplingParams.extra_args`)."""
        extra = None if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params}
        request = Request(
            request_id,
            list(tokens),
            SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra),
            pooling_params=None,
            block_hasher=self._hasher,
        )
        self.scheduler.add_request(request)
        return request

    # -- one engine step --

    def step(self) -> StepResult:
        """One engine step: schedule, the worker's part, then update_from_output."""
        with set_current_vllm_config(self.config):
            so = self.scheduler.schedule()
            md = so.kv_connector_metadata
            assert isinstance(md, OffloadingConnectorMetadata)
            wc = self.worker_connector
            wc.handle_preemptions(md)
            wc.bind_connector_metadata(md)
            # The memcpy worker's loads are checked the step they land; another
            # worker (a spec's own, asynchronous) is checked by its test.
            checked = isinstance(self._spec_worker(), MemcpyWorker)
            loaded_before = len(self.worker.loaded) if checked else 0
            wc.start_load_kv(None)
            loaded = self._check_loads(md, loaded_before) if checked else 0
            self._forward(so)
            wc.wait_for_save()
            finished_sending, finished_recving = wc.get_finished(set(so.finished_req_ids))
            worker_meta = wc.build_connector_worker_meta()
            wc.clear_connector_metadata()
            req_ids = list(so.num_scheduled_tokens)
            sampled = [self._sample(r, so.num_scheduled_tokens[r]) for r in req_ids]
            out = model_runner_output(
                req_ids,
                sampled,
                KVConnectorOutput(
                    finished_sending=finished_sending or None,
                    finished_recving=finished_recving or None,
                    kv_connector_worker_meta=worker_meta,
                ),
            )
            before = set(self.scheduler.requests)
            outputs = self.scheduler.update_from_output(so, out)
            self.steps += 1
        self.preempted |= set(so.preempted_req_ids or ())
        for eco in outputs.values():
            sched_stats = getattr(eco, "scheduler_stats", None)
            if sched_stats is not None and sched_stats.kv_connector_stats:
                self.stats.append(sched_stats.kv_connector_stats)
        done = {r for r in before if r not in self.scheduler.requests}
        return StepResult(so, done, loaded)

    def run(self, max_steps: int = 200, settle: bool = True) -> list[StepResult]:
        """Step until no request is left, then (`settle`) until the offloading is idle."""
        results: list[StepResult] = []
        while self.scheduler.requests:
            if len(results) == max_steps:
                raise AssertionError(
                    f"requests left after {max_steps} steps: {list(self.scheduler.requests)}"
                )
            results.append(self.step())
            if not results[-1].output.num_scheduled_tokens:
                time.sleep(0.002)  # waiting on a tier's thread (a lookup, a promotion)
        if settle:
            self.settle()
        return results

    def busy(self) -> bool:
        return bool(self.connector.has_pending_push_work())

    def settle(self, max_steps: int = 400, pause: float = 0.005) -> None:
        """Step (without requests) until the connector and its tiers are idle: cascades
        written, promotions finished. Tier I/O runs on threads, hence the pauses."""
        for _ in range(max_steps):
            if not self.busy():
                return
            self.step()
            time.sleep(pause)
        raise AssertionError("offloading still busy")

    # -- the model --

    def _sample(self, request_id: str, scheduled: int) -> list[int]:
        request = self.scheduler.requests.get(request_id)
        if request is None or request.num_computed_tokens < request.num_tokens:
            return []  # a chunk of the prompt: nothing sampled yet
        return [(request.num_tokens * 7919 + 17) % VOCAB]

    def _blocks(self, request_id: str) -> tuple[list[int], ...]:
        ids: tuple[list[int], ...] = self.scheduler.kv_cache_manager.get_block_ids(request_id)
        return ids

    def _forward(self, so: SchedulerOutput) -> None:
        """Write each page this step completes (tokens it computed close the page)."""
        for request_id, n in so.num_scheduled_tokens.items():
            request = self.scheduler.requests[request_id]
            after = request.num_computed_tokens
            before = after - n
            tokens = request.all_token_ids
            for g, blocks in enumerate(self._blocks(request_id)):
                for index in range(before // BLOCK, after // BLOCK):
                    block = blocks[index]
                    if block == 0:
                        continue  # the null block: outside a sliding window
                    for layer in range(LAYERS):
                        self.gpu[layer][block] = torch.from_numpy(
                            page_bytes(tokens, (index + 1) * BLOCK, g, layer)
                        )
                    self.pages_written += 1

    def _check_loads(self, md: OffloadingConnectorMetadata, loaded_before: int) -> int:
        """Check every page this step's loads wrote against the request's tokens."""
        expected: dict[tuple[int, int], tuple[list[int], int]] = {}
        for job in md.load_jobs.values():
            spec = job.dst_spec
            assert isinstance(spec, GPULoadStoreSpec)
            tokens = self.scheduler.requests[job.req_id].all_token_ids
            at = 0
            for g, (size, first) in enumerate(
                zip(spec.group_sizes, spec.block_indices, strict=True)
            ):
                for j in range(size):
                    expected[(int(spec.block_ids[at + j]), g)] = (tokens, (first + j + 1) * BLOCK)
                at += size
        pages = self.worker.loaded[loaded_before:]
        assert len(pages) == len(expected), (pages, expected)
        for block, g in pages:
            tokens, end = expected[(block, g)]
            for layer in range(LAYERS):
                want = page_bytes(tokens, end, g, layer)
                got = self.gpu[layer][block].numpy()
                assert np.array_equal(got, want), (
                    f"page of block {block} (group {g}, layer {layer}, tokens < {end}) differs"
                )
            self.pages_checked += 1
        return len(pages)

    # -- the end --

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.worker_connector.shutdown()
        finally:
            try:
                self.scheduler.shutdown()
            finally:
                region = getattr(self.worker_spec, "_harness_region", None)
                if region is not None:
                    region.cleanup()
                remove_shm(self.engine_id)


class RecordingPublisher:
    """Stands in for vLLM's KV event publisher: keeps every event it is given."""

    def __init__(self, sink: list[Any]) -> None:
        self.sink = sink

    def publish(self, batch: Any) -> None:
        self.sink.extend(batch.events)

    def shutdown(self) -> None:
        return

    def get_publisher_config(self) -> None:
        return None


def status(engine: Engine, request_id: str) -> RequestStatus | None:
    request = engine.scheduler.requests.get(request_id)
    return None if request is None else request.status
