"""The module the `kvtiers` entry point names: registers the `s3` tier, and `obj`
(vLLM's object store tier, its options accepted verbatim) on the same code.

Thin on purpose: `kvtiers plugins` and `kvtiers validate` import it, so the tier
classes and the machine checks are named as "module:attr" strings and imported only
when a config uses them.
"""

from __future__ import annotations

from kvtiers.plugins import CONTRACT_VERSION, TierRecord, hookimpl

from kvtiers_s3.schema import OBJ_SCHEMA, S3_SCHEMA, VLLM_ALIASES


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    return [
        TierRecord(
            name="s3",
            cls="kvtiers_s3.tier:S3Tier",
            schema=S3_SCHEMA,
            description=(
                "object store (S3, or any fsspec URL): shared by many engines, verified, "
                "bounded with eviction by policy, persistent"
            ),
            contract_version=CONTRACT_VERSION,
            aliases=VLLM_ALIASES,
            check="kvtiers_s3.check:check_s3",
        ),
        TierRecord(
            name="obj",
            cls="kvtiers_s3.tier:ObjTier",
            schema=OBJ_SCHEMA,
            description="vLLM's object store tier (store_config, prefix, ...) on the s3 tier",
            contract_version=CONTRACT_VERSION,
            aliases=VLLM_ALIASES,
            check="kvtiers_s3.check:check_obj",
        ),
    ]
