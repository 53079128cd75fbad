"""The shared conformance suite against a real redis-server, with every hook of a
persistent, verifying tier: restart (close and open again on the same server),
corrupt (a byte of the block flipped in the stored value), truncate (the value
cut short) and stored_bytes (the block values counted), all through a raw client
of the test's own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kvtiers import SecondaryTier, TierContext
from kvtiers.testing import TierConformance
from kvtiers_redis.tier import RedisTier

from tests.redis.server import RedisServer


class TestRedisTierConformance(TierConformance):
    concurrent_jobs = True  # loads and stores have places of their own on the loop

    @pytest.fixture(autouse=True)
    def _redis_prefix(self, shared_server: RedisServer) -> Iterator[None]:
        self.server = shared_server
        self.prefix = f"conformance-{uuid.uuid4().hex[:12]}"
        yield
        with shared_server.client() as raw:
            names = list(raw.scan_iter(match=f"{self.prefix}:*", count=1000))
            if names:
                raw.delete(*names)

    def make_tier(self, ctx: TierContext, capacity_bytes: int,
                  eviction_policy: str = "lru") -> SecondaryTier:
        return RedisTier(ctx, {"url": self.server.url, "capacity_bytes": capacity_bytes,
                               "prefix": self.prefix, "eviction_policy": eviction_policy})

    def restart(self, tier: SecondaryTier, ctx: TierContext) -> SecondaryTier:
        tier.close()
        return RedisTier(ctx, tier.config)

    def _name(self, tier: SecondaryTier, key: bytes) -> bytes:
        assert isinstance(tier, RedisTier)
        return tier.names.block(key)

    def corrupt(self, tier: SecondaryTier, key: bytes) -> None:
        name = self._name(tier, key)
        with self.server.client() as raw:
            value = raw.get(name)
            assert isinstance(value, bytes), "the key is not stored"
            at = len(value) - self.block_bytes // 2  # a byte of the block
            raw.setrange(name, at, bytes([value[at] ^ 0xFF]))

    def stored_bytes(self, tier: SecondaryTier) -> int:
        """The block values of the tier's namespace, counted by a SCAN of our own
        client: the tier counts `block_bytes` for each against its capacity."""
        pattern = f"{self.prefix}:{tier.ctx.namespace.fingerprint}:b:*"
        with self.server.client() as raw:
            names = list(raw.scan_iter(match=pattern, count=1000))
        return len(names) * tier.ctx.block_bytes

    def truncate(self, tier: SecondaryTier, key: bytes) -> None:
        name = self._name(tier, key)
        with self.server.client() as raw:
            value = raw.get(name)
            assert isinstance(value, bytes), "the key is not stored"
            raw.set(name, value[: len(value) - self.block_bytes // 2])


class TestRedisTierOneBlockPerRequest(TestRedisTierConformance):
    """Blocks larger than half the engine's batch: each key is a request of its own
    (the `block` hooks rather than `batch`)."""

    block_bytes = 1 << 20
