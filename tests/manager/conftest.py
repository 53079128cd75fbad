"""A small harness around the manager: a real pool, real tiers, and a fake engine
that writes random bytes into the slots it stores and checks the bytes it loads."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import pytest
from kvtiers.config.model import TierSection
from kvtiers.contract import create_tier
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.keys import make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.contract.tier import SecondaryTier, TierContext
from kvtiers.manager import TieringOffloadingManager
from kvtiers.policies.lru import LRUPolicy

BLOCK = 4096 + 512  # not a multiple of 4 KiB: slots are rounded up


def key(i: int, group: int = 0) -> bytes:
    return make_key(i.to_bytes(32, "big"), group)


class Harness:
    def __init__(
        self,
        num_slots: int = 16,
        tiers: Sequence[dict[str, Any]] = (),
        policy: Any = None,
        **kwargs: Any,
    ):
        self.clock = ManualClock()
        self.pool = PoolView.anonymous(num_slots, BLOCK)
        self.namespace = Namespace("test/model", (BlockGeometry(2, 2, 64, "float16", 16),))
        self.tiers = [self._make_tier(i, t) for i, t in enumerate(tiers)]
        kwargs.setdefault("cascade_queue_blocks", num_slots)
        # Events on: the tests follow blocks through them (the default is off).
        kwargs.setdefault("enable_events", True)
        # A spec may name its tier ("name") so that two tiers of one type stay apart.
        kwargs.setdefault("tier_names", [t.get("name", t["type"]) for t in tiers])
        self.mgr = TieringOffloadingManager(
            num_slots,
            policy if policy is not None else LRUPolicy.for_slots(num_slots),
            self.tiers,
            clock=self.clock,
            **kwargs,
        )
        self.content: dict[bytes, bytes] = {}

    def _make_tier(self, i: int, spec: dict[str, Any]) -> SecondaryTier:
        """A tier from a spec: {"type", "options"} built through the registry, or
        {"type", "factory"} where `factory(ctx)` builds a test tier by hand."""
        name = spec.get("name", spec["type"])
        ctx = TierContext(self.pool, self.namespace, self.clock, name=name)
        if "factory" in spec:
            return spec["factory"](ctx)
        section = TierSection(spec["type"], spec["options"], f"$.secondary_tiers[{i}]")
        return create_tier(section, ctx)

    def seed(self, tier: SecondaryTier, k: bytes, data: bytes | None = None) -> bytes:
        """Put a block straight into a memory tier (or a faulty tier's inner memory
        tier) behind the manager's back, touching no pool slot; return its bytes."""
        store = getattr(tier, "inner", tier)._store
        data = os.urandom(BLOCK) if data is None else data
        assert store.put(k, data), "tier full"
        self.content[k] = data
        return data

    def store(self, keys: Sequence[bytes], success: bool = True) -> list[bytes]:
        """The engine stores `keys`: prepare, write random bytes, complete."""
        out = self.mgr.prepare_store(keys)
        if out is None:
            return []
        for k, slot in zip(out.keys, out.slots, strict=True):
            data = os.urandom(BLOCK)
            self.pool.block(slot)[:] = data
            if success:
                self.content[k] = data
        self.mgr.complete_store(out.keys, success)
        return out.keys

    def load_and_check(self, keys: Sequence[bytes]) -> None:
        """The engine loads `keys` (all HIT) and checks every byte."""
        slots = self.mgr.prepare_load(keys)
        try:
            for k, slot in zip(keys, slots, strict=True):
                assert bytes(self.pool.block(slot)) == self.content[k], f"wrong bytes for {k.hex()}"
        finally:
            self.mgr.complete_load(keys)

    def settle(self, rounds: int = 50) -> None:
        """Step until every tier job submitted so far has been reported."""
        for _ in range(rounds):
            self.mgr.step()
            for t in self.tiers:
                t.drain(timeout=10)
            self.mgr.step()
            if not self.mgr._traffic.jobs and not any(rt.queue for rt in self.mgr._traffic.tiers):
                return
            time.sleep(0.001)

    def lookup_until_settled(self, k: bytes) -> LookupResult:
        r = self.mgr.lookup(k)
        for _ in range(100):
            if r not in (LookupResult.HIT_PENDING, LookupResult.RETRY):
                return r
            self.settle()
            r = self.mgr.lookup(k)
        return r

    def close(self) -> None:
        self.mgr.close()


@pytest.fixture
def harness():
    made: list[Harness] = []

    def make(*args: Any, **kwargs: Any) -> Harness:
        h = Harness(*args, **kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def memory_tier(capacity_blocks: int = 64, **extra: Any) -> dict[str, Any]:
    return {
        "type": "memory",
        "options": {"capacity_bytes": capacity_blocks * BLOCK, "eviction_policy": "lru",
                    "threads": 1, **extra},
    }


def faulty(inner: dict[str, Any], **faults: Any) -> dict[str, Any]:
    options = {
        "seed": 7, "error_rate": 0.0, "latency_s": 0.0, "hang_rate": 0.0, "hang_s": None,
        "corrupt_rate": 0.0, "corrupt_detected": True,
    }
    options.update(faults)
    options["inner"] = TierSection(inner["type"], inner["options"], "$.inner")
    return {"type": "faulty", "options": options}
