"""The function vLLM's `vllm.general_plugins` entry point names.

vLLM calls `register()` in every process it starts (engine core, workers, API
server), possibly more than once in one process: `register_*` raise ValueError on a
name already registered, which is tolerated. Registration is by module path, so
nothing here imports `kvtiers_vllm.tier` or `kvtiers_vllm.spec`: a config that uses
them imports them (and fails there, clearly, on an unsupported vLLM).
"""

from __future__ import annotations

import contextlib
import logging

from kvtiers_vllm.compat import SUPPORTED_TEXT, installed_vllm, is_supported

TIER_TYPE = "kvtiers"  # {"type": "kvtiers", "tier": {...}} in secondary_tiers
TIER_MODULE, TIER_CLASS = "kvtiers_vllm.tier", "KvtiersTier"
SPEC_NAME = "KvtiersOffloadingSpec"  # "spec_name" in kv_connector_extra_config
SPEC_MODULE = "kvtiers_vllm.spec"

log = logging.getLogger(__name__)


def register() -> None:
    """Register the tier type and the spec name with vLLM's factories (idempotent).

    On a vLLM this package does not support, warns and registers nothing: vLLM itself
    keeps working, and a config naming kvtiers fails with vLLM's unknown-type error.
    """
    version = installed_vllm()
    if version is None or not is_supported(version):
        log.warning("kvtiers-vllm: not registering with vLLM %s (%s)", version, SUPPORTED_TEXT)
        return
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    # ValueError: registered already (this process ran the plugins before).
    with contextlib.suppress(ValueError):
        SecondaryTierFactory.register_tier(TIER_TYPE, TIER_MODULE, TIER_CLASS)
    with contextlib.suppress(ValueError):
        OffloadingSpecFactory.register_spec(SPEC_NAME, SPEC_MODULE, SPEC_NAME)
