"""The module the `kvtiers` entry point names: registers the `fs` tier.

Thin on purpose: `kvtiers plugins` and `kvtiers validate` import it, so the tier
class is named as a "module:Class" string and imported only when a config uses it.
"""

from __future__ import annotations

from kvtiers.plugins import CONTRACT_VERSION, TierRecord, hookimpl

from kvtiers_fs.schema import FS_SCHEMA, VLLM_ALIASES

# The machine check (root exists, is writable) needs kvtiers-core's `TierRecord.check`;
# with an older core, the tier's constructor still runs it.
_CHECK = (
    {"check": "kvtiers_fs.schema:check_machine"}
    if "check" in getattr(TierRecord, "__dataclass_fields__", {})
    else {}
)


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    return [
        TierRecord(
            name="fs",
            cls="kvtiers_fs.tier:FsTier",
            schema=FS_SCHEMA,
            description=(
                "local or shared filesystem: persistent, shared by processes, verified, "
                "crash-safe, O_DIRECT, bounded per root with eviction by policy"
            ),
            contract_version=CONTRACT_VERSION,
            aliases=VLLM_ALIASES,
            **_CHECK,
        )
    ]
