"""Building kvtiers' SGLang backend the way SGLang does: through its own
`StorageBackendFactory` ("dynamic"), then registering a host pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from kvtiers_sglang import BACKEND_CLASS, BACKEND_MODULE
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from tests.sglang.host_pool import HostPool

MODEL = "meta-llama/Tiny-Test"


def extra_config(tiers: list[dict[str, Any]], *, v1: bool = True, **more: Any) -> dict[str, Any]:
    return {
        "backend_name": "kvtiers", "module_path": BACKEND_MODULE, "class_name": BACKEND_CLASS,
        **({"interface_v1": 1} if v1 else {}), "secondary_tiers": tiers, **more,
    }


def fs_tier(root: Path, capacity: int = 10**8) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    return {"type": "fs", "root_dir": str(root), "capacity_bytes": capacity}


def storage_config(extra: dict[str, Any], *, model: str = MODEL, tp_rank: int = 0,
                   tp_size: int = 1, mla: bool = False, layout: str = "page_first",
                   metrics: bool = False) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=metrics,
        is_page_first_layout=layout != "layer_first", model_name=model, extra_config=extra,
    )


def make_backend(extra: dict[str, Any], pool: HostPool | None = None,
                 **config: Any) -> tuple[HiCacheStorage, HostPool]:
    """SGLang's factory builds the backend; the host pool is registered as SGLang's
    controller registers it."""
    pool = pool or HostPool(layout=config.get("layout", "page_first"), mla=config.get("mla", False))
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra, **config), None)
    backend.register_mem_pool_host(pool)
    return backend, pool


def page_keys(gen: torch.Generator, n: int) -> list[str]:
    """SGLang-like page hashes (64 hex digits), random."""
    return [bytes(torch.randint(0, 256, (32,), generator=gen, dtype=torch.uint8).tolist()).hex()
            for _ in range(n)]
