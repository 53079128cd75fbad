"""What the redis tier's own tests share: a context, tiers closed at the end, and a
raw view of what a tier holds in the server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvtiers import TierContext
from kvtiers.contract.clock import Clock
from kvtiers.contract.pool_view import PoolView
from kvtiers.testing import make_context, make_namespace
from kvtiers_redis.tier import RedisTier

from tests.redis.server import RedisServer

BLOCK = 16384
SLOTS = 48


def context(model: str = "kvtiers-redis/test-model", *, pool: PoolView | None = None,
            clock: Clock | None = None) -> TierContext:
    return make_context(BLOCK, SLOTS, namespace=make_namespace(model, BLOCK), pool=pool,
                        clock=clock)


class Tiers:
    """Opens `RedisTier`s on one server; closes every one at the end of the test."""

    def __init__(self, server: RedisServer, prefix: str = "kvt"):
        self.server = server
        self.prefix = prefix
        self.opened: list[RedisTier] = []

    def open(self, ctx: TierContext, capacity_blocks: int = 8, **options: Any) -> RedisTier:
        config = {"url": self.server.url, "capacity_bytes": capacity_blocks * BLOCK,
                  "prefix": self.prefix, **options}
        self.opened.append(RedisTier(ctx, config))
        return self.opened[-1]

    def close_all(self) -> None:
        for tier in reversed(self.opened):
            tier.close()

    def stored(self, tier: RedisTier) -> set[bytes]:
        """Block keys the server holds under `tier`'s namespace (a raw SCAN)."""
        with self.server.client() as raw:
            return {k for n in raw.scan_iter(match=tier.names.pattern(), count=1000)
                    if (k := tier.names.key_of(n)) is not None}


def tiers_of(server: RedisServer) -> Iterator[Tiers]:
    tiers = Tiers(server)
    yield tiers
    tiers.close_all()
