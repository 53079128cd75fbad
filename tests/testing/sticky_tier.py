"""A memory tier whose store outlives it, declaring every capability the suite tests.

The suite's persistent, shared and verifying tests only run against tiers that set
those flags; the core's own tiers set few of them. `StickyMemoryTier` keeps its
`BlockStore` in a process-wide table keyed by (`store_id`, namespace), so that
closing and reopening it is a restart (contents, usage and recency kept) and two
instances with one `store_id` are siblings. Its lookup answers RETRY once for a key
it has not seen, as a shared tier probing its store would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers import LookupResult, SecondaryTier, TierContext
from kvtiers.contract.keys import BlockKey
from kvtiers.tiers.memory import BlockStore, MemoryTier

_STORES: dict[tuple[str, str], BlockStore] = {}


def forget_stores() -> None:
    _STORES.clear()


class StickyMemoryTier(MemoryTier):
    persistent = True
    shared = True
    verifies = True

    def __init__(self, ctx: TierContext, config: Mapping[str, Any]):
        self.store_id: str = config["store_id"]
        self._probed: set[BlockKey] = set()
        super().__init__(ctx, {k: v for k, v in config.items() if k != "store_id"})
        self.config = dict(config)

    def _open_store(self, options: Mapping[str, Any]) -> BlockStore:
        key = (self.store_id, self.ctx.namespace.fingerprint)
        if key not in _STORES:
            _STORES[key] = super()._open_store(options)
        return _STORES[key]

    def _close_store(self) -> None:
        pass  # the storage outlives the tier

    def lookup(self, key: BlockKey) -> LookupResult:
        if key not in self._probed:
            self._probed.add(key)
            return LookupResult.RETRY
        return super().lookup(key)


def reopen(tier: SecondaryTier, ctx: TierContext) -> StickyMemoryTier:
    assert isinstance(tier, StickyMemoryTier)
    return StickyMemoryTier(ctx, tier.config)
