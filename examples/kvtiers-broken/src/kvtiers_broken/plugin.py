"""Fails on import, as a plugin does when one of its dependencies is missing.
The registry must record the error and keep loading every other plugin."""

from __future__ import annotations

import kvtiers_missing_dependency  # noqa: F401  (not installed anywhere, on purpose)
from kvtiers.plugins import TierRecord, hookimpl
from kvtiers.sdk import CONTRACT_VERSION


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    return [TierRecord("broken", "kvtiers_broken.tier:Tier", {}, "never loads", CONTRACT_VERSION)]
