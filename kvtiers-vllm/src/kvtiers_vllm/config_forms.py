"""The module kvtiers-vllm's `kvtiers` entry point names: the forms of vLLM's
`kv_transfer_config` that run kvtiers, contributed to kvtiers' config reader (so
`kvtiers validate` and `load_config` read them; the core knows vLLM's own names
only):

- the spec `KvtiersOffloadingSpec` (`kvtiers_register_vllm_specs`) and the keys of
  its extra config it reads itself, not kvtiers' manager (`SPEC_OPTIONS`);
- the `secondary_tiers` entry `{"type": "kvtiers", "tier": {...}}` (or `KvtiersTier`
  from `kvtiers_vllm.tier`) and its own keys (`TIER_ENTRY_OPTIONS`)
  (`kvtiers_register_vllm_tiers`).

Thin on purpose: `kvtiers plugins` and `kvtiers validate` import it; it imports
neither vLLM nor torch. The spec and the tier read these keys with these schemas.
"""

from __future__ import annotations

from typing import Any

from kvtiers.plugins import VllmSpecRecord, VllmTierRecord, hookimpl
from kvtiers.sdk import CONTRACT_VERSION

from kvtiers_vllm.plugin import SPEC_MODULE, SPEC_NAME, TIER_CLASS, TIER_MODULE, TIER_TYPE

WORKER_KEY = "kvtiers_worker"
WORKERS = ("vllm", "kvtiers")
SHUTDOWN_DRAIN_KEY = "kvtiers_shutdown_drain_s"
STATS_INTERVAL_KEY = "kvtiers_stats_interval_s"


def _seconds(description: str) -> dict[str, Any]:
    return {"type": "number", "minimum": 0, "exclusiveMaximum": 1e9,
            "title": "a number of seconds >= 0", "description": description}  # fmt: skip


#: The extra-config keys `KvtiersOffloadingSpec` reads itself, as JSON Schema.
SPEC_OPTIONS: dict[str, dict[str, Any]] = {
    WORKER_KEY: {
        "enum": list(WORKERS),
        "description": 'which worker copies GPU <-> CPU: "vllm" (vLLM\'s CUDA worker) '
        "or \"kvtiers\" (kvtiers' DeviceSwapper)",
    },
    STATS_INTERVAL_KEY: _seconds("how often the tiers' counters are sent (0: every step)"),
    SHUTDOWN_DRAIN_KEY: _seconds("how long shutdown waits for the tiers' writes"),
    # vLLM's own keys, read as vLLM's CPU spec and tiering spec read them.
    "store_threshold": {
        "type": "integer", "minimum": 0,
        "description": "offers of a block before the CPU pool stores it (2 or more: on)",
    },
    "max_tracker_size": {
        "type": "integer", "minimum": 1,
        "description": "blocks whose offers store_threshold counts (LRU)",
    },
    "canonical_layout": {
        "type": "boolean", "description": "vLLM's canonical per-layer CPU layout",
    },
}  # fmt: skip


def _any_case(choices: tuple[str, ...]) -> dict[str, Any]:
    alternatives = "|".join(c.lower() for c in choices)
    return {"type": "string", "pattern": f"(?i)^({alternatives})$",
            "title": f"one of {', '.join(choices)}"}  # fmt: skip


#: The keys of a `{"type": "kvtiers", "tier": {...}}` entry besides its tier section.
TIER_ENTRY_OPTIONS: dict[str, dict[str, Any]] = {
    "medium": _any_case(("STORAGE", "CPU")),
    "locality": _any_case(("LOCAL", "REMOTE")),
    "enable_kv_events": {"type": "boolean"},
    "job_timeout_s": {
        "type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e9,
        "title": "a number of seconds > 0",
        "description": "how long a promotion may take before vLLM is told it failed "
        "(vLLM 0.34 and later: its CPU chunks stay held until the tier's I/O ends)",
    },  # fmt: skip
    "stats_interval_s": _seconds(
        "how often the stats vLLM asks for every step carry the tier's counters (0: every step)"
    ),
    "backpressure": {"type": "object", "description": "vLLM's, handled by vLLM's factory"},
}


@hookimpl
def kvtiers_register_vllm_specs() -> list[VllmSpecRecord]:
    return [
        VllmSpecRecord(
            name=SPEC_NAME,
            package=SPEC_MODULE.partition(".")[0],
            description="kvtiers' manager and tiers as vLLM's offloading spec (level 2)",
            contract_version=CONTRACT_VERSION,
            options=SPEC_OPTIONS,
        )
    ]


@hookimpl
def kvtiers_register_vllm_tiers() -> list[VllmTierRecord]:
    return [
        VllmTierRecord(
            name=TIER_TYPE,
            class_name=TIER_CLASS,
            module=TIER_MODULE,
            description="a kvtiers tier under vLLM's own CPU tier (level 1)",
            contract_version=CONTRACT_VERSION,
            inner_key="tier",
            options=TIER_ENTRY_OPTIONS,
        )
    ]
