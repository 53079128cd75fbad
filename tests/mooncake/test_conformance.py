"""The shared conformance suite against a real mooncake_master, with the hooks of
a shared, verifying tier: sibling (a second client on the same master), corrupt
(a byte of the block flipped in the stored object), truncate (the object cut
short) and stored_bytes (the master's own listing of the namespace), all through
the master and a raw client of the test's own."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kvtiers import SecondaryTier, TierContext
from kvtiers.testing import TierConformance
from kvtiers_mooncake.tier import MooncakeTier

from tests.mooncake.helpers import RawClient
from tests.mooncake.master import Master
from tests.mooncake.netns import NetNamespace


class TestMooncakeTierConformance(TierConformance):
    concurrent_jobs = True  # loads and stores have threads of their own

    @pytest.fixture(autouse=True)
    def _mooncake(self, ns: NetNamespace, shared_master: Master,
                  shared_raw: RawClient) -> None:
        self.ns = ns
        self.master = shared_master
        self.raw = shared_raw
        self.prefix = f"conf-{uuid.uuid4().hex[:12]}"

    def _open(self, ctx: TierContext, config: dict[str, Any]) -> MooncakeTier:
        with self.ns.entered():
            return MooncakeTier(ctx, config)

    def make_tier(self, ctx: TierContext, capacity_bytes: int,
                  eviction_policy: str = "lru") -> SecondaryTier:
        return self._open(ctx, {"master_address": self.master.address,
                                "capacity_bytes": capacity_bytes, "prefix": self.prefix,
                                "eviction_policy": eviction_policy})

    def sibling(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        return self._open(ctx, dict(tier.config))

    def _name(self, tier: SecondaryTier, key: bytes) -> str:
        assert isinstance(tier, MooncakeTier)
        return tier.names.block(key)

    def corrupt(self, tier: SecondaryTier, key: bytes) -> None:
        name = self._name(tier, key)
        value = bytearray(self.raw.get(name))
        assert value, "the key is not stored"
        at = len(value) - self.block_bytes // 2  # a byte of the block
        value[at] ^= 0xFF
        self.raw.replace(name, bytes(value))

    def truncate(self, tier: SecondaryTier, key: bytes) -> None:
        name = self._name(tier, key)
        value = self.raw.get(name)
        assert value, "the key is not stored"
        self.raw.replace(name, value[: len(value) - self.block_bytes // 2])

    def stored_bytes(self, tier: SecondaryTier) -> int:
        """The block objects of the tier's namespace in the master's own listing:
        the tier counts `block_bytes` for each against its capacity."""
        assert isinstance(tier, MooncakeTier)
        base = tier.names.base
        return sum(1 for n in self.master.names() if n.startswith(base)) * tier.ctx.block_bytes


class TestMooncakeTierLargeBlocks(TestMooncakeTierConformance):
    """Blocks of 1 MiB: fewer to a unit, and objects past the local buffer's share."""

    block_bytes = 1 << 20
