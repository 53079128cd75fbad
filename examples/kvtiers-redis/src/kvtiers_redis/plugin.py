"""The module the `kvtiers` entry point names: registers the `redis` tier.

Thin on purpose: `kvtiers plugins` and `kvtiers validate` import it, so it names
the tier class as a "module:Class" string (redis-py is imported only when a config
uses the tier) and the schema comes from a standard-library-only module.
"""

from __future__ import annotations

from kvtiers.plugins import TierRecord, hookimpl
from kvtiers.sdk import CONTRACT_VERSION

from kvtiers_redis.schema import SCHEMA


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    return [
        TierRecord(
            name="redis",
            cls="kvtiers_redis.tier:RedisTier",
            schema=SCHEMA,
            description=(
                "blocks in a Redis server: persistent, verified, bounded with eviction by "
                "policy, optional expiry (ttl_s)"
            ),
            contract_version=CONTRACT_VERSION,
        )
    ]
