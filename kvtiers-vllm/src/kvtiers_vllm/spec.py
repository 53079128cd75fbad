"""`KvtiersOffloadingSpec`: the whole kvtiers stack as vLLM's offloading spec.

    "kv_transfer_config": {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "KvtiersOffloadingSpec",
        "cpu_bytes_to_use": 429496729600, "eviction_policy": "lru",
        "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/nvme_storage"}]}}

vLLM finds the class by `spec_name` once `kvtiers_vllm`'s `vllm.general_plugins`
entry point registered it, or by `"spec_module_path": "kvtiers_vllm.spec"`.

Scheduler side (`get_manager`): the extra config is read by kvtiers' config layer
(`kvtiers.config.load_config`, vLLM's key names mapped, a missing fs capacity
derived), and kvtiers' manager — its eviction policies, admission, write-through or
write-back, deadlines, circuit breakers, verified promotions — and its tiers run
behind vLLM's `OffloadingManager` interface (`manager_adapter.KvtiersManager`). The
tiers read and write vLLM's shared CPU region (`/dev/shm/vllm_offload_<engine_id>`):
kvtiers slot `i` is vLLM's CPU chunk `i`, the whole row (every worker's part).

Worker side (`get_worker`): vLLM's own CUDA worker (`CPUOffloadingWorker`) over the
same region, or with `"kvtiers_worker": "kvtiers"` kvtiers' `DeviceSwapper`
(`kvtiers_vllm.worker`), which writes vLLM's chunk layout byte for byte or refuses,
when built, a layout it cannot reproduce.

vLLM also calls two class methods in the API-server process, from the raw extra
config: `build_metric_definitions` and `config_info_keys`. They look no tier up
(vLLM's tiering spec would look kvtiers' tier types up in its own factory and fail).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from kvtiers_vllm.compat import require_vllm

require_vllm()  # before anything of vLLM's: a clear error on another version

from kvtiers import build_manager  # noqa: E402
from kvtiers.config import (  # noqa: E402
    KvtiersConfig,
    load_config,
)
from kvtiers.errors import ConfigError  # noqa: E402
from kvtiers.manager import num_slots_for, tier_names  # noqa: E402
from kvtiers.plugins import get_registry  # noqa: E402
from kvtiers.sdk import (  # noqa: E402
    Namespace,
    PoolView,
)
from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCaches,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
)
from vllm.v1.kv_offload.config import OffloadingConfig  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPUOffloadingInfo  # noqa: E402
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion  # noqa: E402

from kvtiers_vllm import identity, nodes, store_threshold  # noqa: E402
from kvtiers_vllm.config_forms import (  # noqa: E402
    SHUTDOWN_DRAIN_KEY,
    STATS_INTERVAL_KEY,
    WORKER_KEY,
    WORKERS,
)
from kvtiers_vllm.manager_adapter import KvtiersManager  # noqa: E402
from kvtiers_vllm.spec_metrics import metric_definitions  # noqa: E402

log = logging.getLogger("kvtiers_vllm")

SPEC_NAME = "KvtiersOffloadingSpec"
#: The config-info labels of the spec: vLLM's CPU tier facts, then which tier.
INFO_KEYS = (*CPUOffloadingInfo.config_info_keys(), "tier", "tier_type")


class KvtiersOffloadingSpec(OffloadingSpec):
    """See the module docstring. Built by vLLM in the scheduler and in every worker
    (`get_manager` runs in the first, `get_worker` in the others); the kvtiers config
    is read only by `get_manager`."""

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return metric_definitions()

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        return INFO_KEYS

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        extra = self.extra_config
        self.cpu_bytes_to_use = _cpu_bytes(extra)
        self.worker_kind = extra.get(WORKER_KEY, "vllm")
        if self.worker_kind not in WORKERS:
            raise ValueError(
                f"{SPEC_NAME}: {WORKER_KEY} is {self.worker_kind!r}; use one of "
                + ", ".join(repr(w) for w in WORKERS)
            )
        self.shutdown_drain_s = float(extra.get(SHUTDOWN_DRAIN_KEY, 5.0))
        self.stats_interval_s = float(extra.get(STATS_INTERVAL_KEY, 1.0))
        # vLLM's CPU spec's store filter (its tiering spec refuses it; this one
        # keeps the CPU pool's behaviour of vLLM's CPUOffloadingSpec).
        self.store_threshold = store_threshold.from_extra_config(extra, SPEC_NAME)
        if self.config.canonical_layout and self.worker_kind == "kvtiers":
            raise ValueError(
                f"{SPEC_NAME}: canonical_layout needs vLLM's worker (kvtiers' worker "
                f"writes vLLM's direct layout); remove {WORKER_KEY} or canonical_layout"
            )
        # One row of vLLM's shared region per chunk: every worker's part in rank
        # order (one part when the layout is replicated), rounded up to a page.
        self.replicated_layout = bool(config.replicated_layout)
        copies = 1 if self.replicated_layout else max(1, config.parallel.world_size)
        self.cpu_page_size_per_worker = config.worker_kv_bytes_per_block * self.blocks_per_chunk
        self.chunk_bytes = self.cpu_page_size_per_worker * copies
        page = SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT
        self.kv_bytes_per_chunk = -(-self.chunk_bytes // page) * page
        self.num_chunks = (
            self.cpu_bytes_to_use // self.kv_bytes_per_chunk if self.chunk_bytes > 0 else 0
        )
        self.all_layers_portable: bool | None = None  # canonical_layout: set by the worker
        self._manager: KvtiersManager | None = None
        self._worker: OffloadingWorker | None = None

    # ---------------------------------------------------------------- scheduler

    def kvtiers_config(self) -> KvtiersConfig:
        """The extra config read by kvtiers' config layer, with this machine's
        checks (a missing fs capacity is derived from the free space);
        `ValueError` naming every problem."""
        doc = dict(self.extra_config)
        # vLLM built this class (or a subclass of it, found by whatever name): the
        # spec is known, and the config layer checks only which spec it is (its own
        # keys, `config_forms.SPEC_OPTIONS`, it checks and leaves out).
        doc["spec_name"] = SPEC_NAME
        doc.pop("spec_module_path", None)
        registry = get_registry()
        if SPEC_NAME not in registry.vllm_specs:
            raise ValueError(
                f"{SPEC_NAME}: kvtiers' config reader does not know this spec: "
                "kvtiers-vllm's `kvtiers` entry point (kvtiers_vllm.config_forms) is not "
                "loaded; reinstall kvtiers-vllm (`pip install kvtiers-vllm`, or "
                "`make setup` in a checkout) and check KVTIERS_PLUGINS_DISABLE / "
                "KVTIERS_PLUGINS_ALLOW"
            )
        try:
            cfg = load_config(doc, registry)
        except ConfigError as exc:
            raise ValueError(
                f"{SPEC_NAME}: kv_connector_extra_config is not a valid kvtiers config "
                f"(`kvtiers validate` says the same):\n{exc}"
            ) from exc
        for line in (*cfg.warnings, *cfg.notes):
            log.info("kvtiers config: %s", line)
        return cfg

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = self._build_manager()
        return self._manager

    def _build_manager(self) -> KvtiersManager:
        cfg = self.kvtiers_config()
        if self.chunk_bytes <= 0:
            raise ValueError(f"{SPEC_NAME}: vLLM reports no KV bytes per block to offload")
        slots = num_slots_for(cfg, self.chunk_bytes)
        if slots != self.num_chunks or slots <= 0:
            raise ValueError(
                f"{SPEC_NAME}: cpu_bytes_to_use {cfg.cpu_bytes_to_use} holds {slots} "
                f"chunks of {self.chunk_bytes} bytes; at least one is needed"
            )
        region: SharedOffloadRegion | None = None
        pool: PoolView | None = None
        if cfg.secondary_tiers:
            # The tiers read and write the rows vLLM's workers fill.
            region = SharedOffloadRegion(
                engine_id=self.config.engine_id, num_chunks=self.num_chunks, rank=None,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )  # fmt: skip
            assert region.mmap_obj is not None
            pool = PoolView(region.mmap_obj, self.chunk_bytes, self.kv_bytes_per_chunk)
        try:
            manager = build_manager(
                cfg, pool, self.namespace() if pool is not None else None,
                block_bytes=self.chunk_bytes,
                enable_events=cfg.enable_kv_events or self.kv_events_config.enable_kv_cache_events,
                # vLLM's policies: a transfer's end is no use (request-scoped recency)
                pinned_in_place=True,
            )  # fmt: skip
        except BaseException:
            release = _releaser(pool, region)
            if release is not None:
                release()
            raise
        names = tier_names(cfg)
        info = CPUOffloadingInfo.from_config(
            self.config, self.num_chunks, self.kv_bytes_per_chunk
        ).as_config_info()
        log.info(
            "%s: kvtiers manager with %d CPU slots of %d bytes (%s policy, %s) and "
            "tiers %s", SPEC_NAME, self.num_chunks, self.kv_bytes_per_chunk,
            cfg.eviction_policy, cfg.write_policy, names or "none",
        )  # fmt: skip
        return KvtiersManager(
            manager,
            tier_types={n: s.type for n, s in zip(names, cfg.secondary_tiers, strict=True)},
            info=info,
            shutdown_drain_s=self.shutdown_drain_s,
            stats_interval_s=self.stats_interval_s,
            on_shutdown=_releaser(pool, region),
            store_threshold=self.store_threshold,
            touch_orders_only=cfg.eviction_policy == "lru",
        )

    def namespace(self) -> Namespace:
        """kvtiers' namespace of vLLM's run identity, the one `KvtiersTier` (level 1)
        gives the same run: the two levels share what they store."""
        return identity.namespace_for(self, identity.payload_bytes(self, self.kv_bytes_per_chunk))

    # ---------------------------------------------------------------- worker

    def worker_region(self) -> SharedOffloadRegion:
        """This worker's view of vLLM's shared CPU region (its part of each row)."""
        rank = 0 if self.replicated_layout else self.config.parallel.rank
        return SharedOffloadRegion(
            engine_id=self.config.engine_id, num_chunks=self.num_chunks, rank=rank,
            kv_bytes_per_chunk=self.kv_bytes_per_chunk,
            cpu_page_size=self.cpu_page_size_per_worker,
        )  # fmt: skip

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = self.create_worker(kv_caches)
        return self._worker

    def create_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        """vLLM's CUDA worker, or kvtiers' swapper (`kvtiers_worker`), over
        `worker_region()`. With `canonical_layout` vLLM's worker writes vLLM's
        canonical per-layer layout, certified per layer first as vLLM's tiering
        spec does (`canonical_refs`). Secondary tiers on an engine whose workers
        span nodes are refused (`NotImplementedError`, as vLLM 0.34's tiering spec
        does: `kvtiers_vllm.nodes`)."""
        if (
            self.extra_config.get("secondary_tiers")
            and self.config.parallel.world_size > 1
            and nodes.workers_span_nodes()
        ):
            raise NotImplementedError(
                f"{SPEC_NAME}: secondary tiers are not supported on an engine whose "
                "workers span several nodes (the tiers run in the engine core and read "
                "only its node's CPU region, vllm#54415); keep the engine on one node "
                "or remove secondary_tiers"
            )
        if self.worker_kind == "kvtiers":
            from kvtiers_vllm.worker import KvtiersSwapWorker

            region = self.worker_region()
            try:
                return KvtiersSwapWorker(
                    kv_caches, region, self.blocks_per_chunk, rank=region.rank,
                    world_size=1 if self.replicated_layout else self.config.parallel.world_size,
                )  # fmt: skip
            except BaseException:
                region.cleanup()
                raise
        from vllm.v1.kv_offload.cpu.gpu_worker import CPUOffloadingWorker

        region = self.worker_region()
        try:
            if self.config.canonical_layout:
                self.all_layers_portable = canonical_refs(kv_caches, self.config)
            return CPUOffloadingWorker(
                kv_caches=kv_caches, blocks_per_chunk=self.blocks_per_chunk,
                num_cpu_chunks=self.num_chunks, mmap_region=region,
                canonical_layout=self.config.canonical_layout,
            )  # fmt: skip
        except BaseException:
            region.cleanup()
            raise


def canonical_refs(kv_caches: CanonicalKVCaches, config: OffloadingConfig) -> bool:
    """vLLM's check before a canonical layout (`TieringOffloadingSpec`): every layer
    has a canonical mapping, and a storage namespace shared across topologies only
    takes parallelism-agnostic layers; whether every layer is portable. Raises
    `RuntimeError` (vLLM's words) otherwise."""
    refs = [ref for group in kv_caches.group_data_refs for ref in group]
    if any(ref.mapping is None for ref in refs):
        raise RuntimeError(
            f"{SPEC_NAME}: canonical_layout was requested but the KV cache layout could "
            "not be certified for canonical offload (offload workers must be exactly the "
            "TP group, and packed / cross-layer KV layouts are not supported). Remove "
            "canonical_layout from kv_connector_extra_config."
        )
    portable = all(ref.mapping is not None and ref.mapping.parallelism_agnostic for ref in refs)
    if config.parallel.is_parallelism_agnostic and not portable:
        raise RuntimeError(
            f"{SPEC_NAME}: canonical_layout could not certify every layer as "
            "parallelism-agnostic, but the storage namespace is shared across "
            "topologies. Remove canonical_layout from kv_connector_extra_config."
        )
    log.info("%s: canonical KV layout (all layers portable: %s)", SPEC_NAME, portable)
    return portable


def _releaser(pool: PoolView | None, region: SharedOffloadRegion | None) -> Any:
    """What unmaps the scheduler's view of the region at shutdown: the pool's
    memoryview goes first, or the mapping could not be closed."""
    if region is None:
        return None

    def release() -> None:
        if pool is not None:
            with contextlib.suppress(BufferError):
                pool.buffer.release()
        region.cleanup()

    return release


def _cpu_bytes(extra: Mapping[str, Any]) -> int:
    value = extra.get("cpu_bytes_to_use")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(
            f"{SPEC_NAME}: kv_connector_extra_config needs cpu_bytes_to_use, the CPU "
            f"pool's size in bytes (a positive number), got {value!r}"
        )
    return int(value)


__all__ = ["SPEC_NAME", "KvtiersOffloadingSpec"]
