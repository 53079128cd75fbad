"""The module the `kvtiers` entry point names: registers the `mooncake` tier.

Thin on purpose: `kvtiers plugins` and `kvtiers validate` import it, so the tier
class and the machine checks are named as "module:attr" strings and Mooncake's
native library is loaded only when a config uses the tier.
"""

from __future__ import annotations

from kvtiers.plugins import CONTRACT_VERSION, TierRecord, hookimpl

from kvtiers_mooncake.schema import SCHEMA, VLLM_ALIASES


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    return [
        TierRecord(
            name="mooncake",
            cls="kvtiers_mooncake.tier:MooncakeTier",
            schema=SCHEMA,
            description=(
                "Mooncake Store (a master and memory segments over TCP/RDMA): shared by "
                "a fleet, zero-copy from the pool, verified, a quota per engine"
            ),
            contract_version=CONTRACT_VERSION,
            aliases=VLLM_ALIASES,
            check="kvtiers_mooncake.check:check_mooncake",
        )
    ]
