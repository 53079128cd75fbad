"""Reading vLLM's `kv_transfer_config` as a kvtiers config.

vLLM configures its `OffloadingConnector` with a `kv_transfer_config`
(`{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
"kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", ...}}`). The
tiering spec's options sit in `kv_connector_extra_config` and mostly share kvtiers'
names (`cpu_bytes_to_use`, `eviction_policy`, `secondary_tiers`, each tier's
`type`). Tier keys that only differ in name are mapped through each `TierRecord`'s
`aliases` (by `sections.Checker`); keys kvtiers has no use for (`block_size`, a
tier's `n_write_threads` where the tier has no such option, ...) are accepted with
a warning naming them, so a working vLLM config always loads.

Detection: an object with `kv_connector`, `kv_role` or `kv_connector_extra_config`
is a whole kv_transfer_config; one with `spec_name` is its extra config; anything
else is a kvtiers config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtiers.config.messages import did_you_mean, found, show
from kvtiers.config.paths import ROOT, join
from kvtiers.config.sections import Checker

NATIVE = "kvtiers"
VLLM_TRANSFER = "vllm_kv_transfer_config"
VLLM_EXTRA = "vllm_extra_config"

EXTRA_KEY = "kv_connector_extra_config"
TIERING_SPEC = "TieringOffloadingSpec"
CONNECTORS = frozenset({"OffloadingConnector"})

# vLLM's KVTransferConfig fields: they configure vLLM's side of the connector and
# are none of kvtiers' business, so they pass without a warning.
TRANSFER_FIELDS = frozenset(
    {
        "kv_connector",
        "engine_id",
        "kv_buffer_device",
        "kv_buffer_size",
        "kv_role",
        "kv_rank",
        "kv_parallel_size",
        "kv_ip",
        "kv_port",
        EXTRA_KEY,
        "kv_connector_module_path",
        "kv_load_failure_policy",
        "enable_permute_local_kv",
    }
)
_MARKERS = frozenset({"kv_connector", "kv_role", EXTRA_KEY})
# Extra-config keys that choose vLLM's spec class rather than configure it.
_SPEC_KEYS = frozenset({"spec_name", "spec_module_path"})


@dataclass(frozen=True)
class Unwrapped:
    """The tiering options as a kvtiers document, the JSON path they sit at in the
    source (for messages), and which format the source was."""

    doc: dict[str, Any]
    base: str
    source_format: str


def detect(doc: dict[str, Any]) -> str:
    """NATIVE, VLLM_TRANSFER or VLLM_EXTRA."""
    if _MARKERS & doc.keys():
        return VLLM_TRANSFER
    if "spec_name" in doc:
        return VLLM_EXTRA
    return NATIVE


def unwrap(doc: dict[str, Any], checker: Checker) -> Unwrapped | None:
    """The kvtiers document inside `doc`; warnings and problems go to `checker`.
    None when there is nothing to validate (the extra config is not an object)."""
    fmt = detect(doc)
    if fmt == NATIVE:
        return Unwrapped(doc, ROOT, NATIVE)
    extra: Any = doc
    base = ROOT
    if fmt == VLLM_TRANSFER:
        for key in doc:
            if key not in TRANSFER_FIELDS:
                checker.warnings.append(
                    f"{join(ROOT, key)}: ignored, not a field of vLLM's kv_transfer_config"
                    f"{did_you_mean(key, TRANSFER_FIELDS)}"
                )
        connector = doc.get("kv_connector")
        if connector not in CONNECTORS:
            checker.warnings.append(
                f"{join(ROOT, 'kv_connector')}: is {show(connector)}; kvtiers reads "
                f"{EXTRA_KEY} as options of vLLM's {' or '.join(sorted(CONNECTORS))}"
            )
        base = join(ROOT, EXTRA_KEY)
        extra = doc.get(EXTRA_KEY, {})
        if not isinstance(extra, dict):
            checker.problem(
                base, f"expected an object (the connector's options), found {found(extra)}"
            )
            return None
    spec = extra.get("spec_name")
    if spec != TIERING_SPEC:
        builds = (
            f"vLLM builds {show(spec)}"
            if spec is not None
            else "unset, vLLM builds CPUOffloadingSpec"
        )
        checker.warnings.append(
            f"{join(base, 'spec_name')}: {builds}; kvtiers reads these options as a "
            f'{TIERING_SPEC}\'s (set "spec_name": "{TIERING_SPEC}")'
        )
    native = {k: v for k, v in extra.items() if k not in _SPEC_KEYS}
    return Unwrapped(native, base, fmt)
