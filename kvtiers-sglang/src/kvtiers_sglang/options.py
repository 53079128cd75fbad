"""The backend's options: SGLang's extra config read as a kvtiers config.

`--hicache-storage-backend-extra-config` is one JSON object: SGLang's keys
(`backend_name`, `module_path`, `class_name`, `interface_v1`), kvtiers' config
(`secondary_tiers`, `job_timeout_s`, `breaker`, `model`, ...; no `cpu_bytes_to_use`:
SGLang's host pool is the pool) and this backend's own keys (`exists_wait_s`,
`metrics_port`). `kvtiers validate` reads the same object the same way
(`kvtiers.config.sglang`); a bad one fails SGLang's start with every problem named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers import load_config
from kvtiers.config import KvtiersConfig

#: how long one existence query waits for tiers still probing, by default
EXISTS_WAIT_S = 0.2


@dataclass(frozen=True)
class BackendOptions:
    config: KvtiersConfig
    interface_v1: bool
    exists_wait_s: float = EXISTS_WAIT_S
    metrics_port: int | None = None


def read_options(extra_config: Mapping[str, Any] | None) -> BackendOptions:
    """The validated options; `kvtiers.ConfigError` listing every problem."""
    doc = dict(extra_config or {})
    doc.setdefault("module_path", "kvtiers_sglang.backend")
    doc.setdefault("class_name", "KvtiersHiCacheStorage")
    config = load_config(doc)
    port = doc.get("metrics_port")
    return BackendOptions(
        config=config,
        interface_v1=bool(doc.get("interface_v1", 0)),
        exists_wait_s=float(doc.get("exists_wait_s", EXISTS_WAIT_S)),
        metrics_port=None if port is None else int(port),
    )
