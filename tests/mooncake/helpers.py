"""What the mooncake tier's own tests share: a context, tiers built inside the
test namespace and closed at the end, and a raw Mooncake client of the test's
own (another program writing at our names)."""

from __future__ import annotations

import ctypes
import mmap
import threading
import uuid
from typing import Any

from kvtiers import TierContext
from kvtiers.contract.clock import Clock, monotonic
from kvtiers.testing import make_context, make_namespace
from kvtiers_mooncake.tier import MooncakeTier

from tests.mooncake.master import Master
from tests.mooncake.netns import NetNamespace

BLOCK = 32768
SLOTS = 48
MiB = 1 << 20


def context(model: str = "kvtiers-mooncake/test-model", *, clock: Clock = monotonic,
            block: int = BLOCK, slots: int = SLOTS) -> TierContext:
    """A context on the real clock: these tests wait for real processes (the
    breaker's retry_s passes in real time)."""
    return make_context(block, slots, namespace=make_namespace(model, block), clock=clock)


class Tiers:
    """Opens `MooncakeTier`s on one master, inside the namespace; closes every one at
    the end of the test."""

    def __init__(self, ns: NetNamespace, master: Master, prefix: str | None = None):
        self.ns = ns
        self.master = master
        self.prefix = prefix or f"t{uuid.uuid4().hex[:10]}"
        self.opened: list[MooncakeTier] = []

    def config(self, capacity_bytes: int, **options: Any) -> dict[str, Any]:
        return {"master_address": self.master.address, "capacity_bytes": capacity_bytes,
                "prefix": self.prefix, "timeout_s": 5.0, **options}

    def open(self, ctx: TierContext, capacity_blocks: int = 16, **options: Any) -> MooncakeTier:
        config = self.config(capacity_blocks * ctx.block_bytes, **options)
        with self.ns.entered():
            tier = MooncakeTier(ctx, config)
        self.opened.append(tier)
        return tier

    def close_all(self) -> None:
        for tier in reversed(self.opened):
            tier.close()
        self.opened.clear()

    def stored(self, tier: MooncakeTier) -> set[bytes]:
        """Block keys the master lists under `tier`'s namespace."""
        return {k for n in self.master.names() if (k := tier.names.key_of(n)) is not None}


class RawClient:
    """A plain Mooncake client in the namespace (its own segment), for planting and
    damaging objects behind the tier's back. Every call runs on the namespace's
    thread."""

    def __init__(self, ns: NetNamespace, master: Master, segment_bytes: int = 32 * MiB):
        from kvtiers_mooncake.native import load_store_module

        self.ns = ns
        self.store: Any = load_store_module().MooncakeDistributedStore()
        code = ns.run(self.store.setup, "127.0.0.1", "P2PHANDSHAKE", segment_bytes, 16 * MiB,
                      "tcp", "", master.address)
        assert code == 0, f"raw client setup: {code}"

    def get(self, name: str) -> bytes:
        return bytes(self.ns.run(self.store.get, name))

    def put(self, name: str, value: bytes) -> int:
        return int(self.ns.run(self.store.put, name, value))

    def remove(self, name: str, force: bool = True) -> int:
        return int(self.ns.run(self.store.remove, name, force))

    def exists(self, name: str) -> bool:
        return bool(self.ns.run(self.store.is_exist, name) == 1)

    def replace(self, name: str, value: bytes) -> None:
        """Put `value` at `name` in place of what is there (forced remove, then put)."""
        self.remove(name)
        code = self.put(name, value)
        assert code == 0, f"put {name}: {code}"

    def close(self) -> None:
        # Mooncake's close joins its threads for ~2 s: not on the test's time.
        threading.Thread(target=self.store.close, name="raw-client-close").start()


def buffer(nbytes: int) -> tuple[mmap.mmap, int]:
    buf = mmap.mmap(-1, nbytes)
    return buf, ctypes.addressof(ctypes.c_char.from_buffer(buf))
