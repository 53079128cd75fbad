"""Configuration: one JSON document, parsed and validated into typed objects before
anything starts.

`load_config(source)` accepts a kvtiers config or vLLM's kv_transfer_config and
returns a frozen `KvtiersConfig`, or raises one `ConfigError` listing every problem
with its JSON path. The schema (`CORE_SCHEMA`) is also the documentation:
`python -m kvtiers.config.docs` writes docs/configuration.md from it.

`load_config` is imported on first use: tier code imports `TierSection` from here
and should not pay for jsonschema (~90 ms) to get a dataclass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtiers.config.model import (
    BreakerConfig,
    KvtiersConfig,
    MetricsConfig,
    TierSection,
    WritePolicy,
)
from kvtiers.config.schema import CORE_SCHEMA
from kvtiers.lazy import lazy_names

if TYPE_CHECKING:
    from kvtiers.config.loader import load_config

__all__ = [
    "CORE_SCHEMA",
    "BreakerConfig",
    "MetricsConfig",
    "KvtiersConfig",
    "TierSection",
    "WritePolicy",
    "load_config",
]


__getattr__ = lazy_names(__name__, {"load_config": "kvtiers.config.loader"})
