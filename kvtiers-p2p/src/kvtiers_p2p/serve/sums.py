"""`BlockSums`: the checksums a `PeerServer` ships, one per block while it stays
in the pool.

Summing a block at every fetch would read it once more per puller; summing it once
is right only while the key names the same bytes. It need not for good: a key
evicted and stored again holds the bytes of that store (KV computed twice need not
be bit-identical). So a sum is forgotten when its block leaves the pool: the
parent calls `left_pool` from the eviction (`ParentManager.watch_removals`),
before the freed slot can hold other bytes, and the server's thread drops those
sums (`of`) after pinning what it ships - a removal that came before the pin is
always seen. A parent that cannot report removals gets a sum per fetch.

Threads: `left_pool` runs on the parent's thread (the scheduler's, under the
manager's lock) and only reads the table and appends to a deque; everything else
is the server thread's. O(1) per key; at most one sum per pool slot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import cast

from kvtiers.sdk import BlockKey, ParentManager, PoolView, checksum, checksum_slots

__all__ = ["BlockSums"]


class BlockSums:
    """See the module docstring."""

    def __init__(self, parent: ParentManager, pool: PoolView):
        self._pool = pool
        self._sums: dict[BlockKey, int] = {}
        # Keys of `_sums` that left the pool since (appended by the parent's thread);
        # `_lost`: too many to list, every sum goes.
        self._stale: deque[BlockKey] = deque()
        self._lost = False
        self._limit = pool.num_slots
        watch = getattr(parent, "watch_removals", None)
        #: whether sums are kept at all (the parent reports removals)
        self.cached = bool(watch(self.left_pool)) if callable(watch) else False

    def __len__(self) -> int:
        return len(self._sums)

    def of(self, key: BlockKey, slot: int) -> int:
        """The checksum of `key`'s block, pinned in `slot` (the server's thread)."""
        if self._stale or self._lost:
            self._drop_stale()
        known = self._sums.get(key)
        if known is None:
            known = checksum(self._pool.block(slot))
            self.remember(key, known)
        return known

    def of_many(self, keys: Sequence[BlockKey], slots: Sequence[int]) -> list[int]:
        """`of` for each key and the slot it is pinned in (the server's thread):
        the sums known in one pass, the others taken together (C, when built)."""
        if self._stale or self._lost:
            self._drop_stale()
        known = list(map(self._sums.get, keys))
        if None in known:
            missing = [i for i, value in enumerate(known) if value is None]
            for i, value in zip(missing, checksum_slots(self._pool, [slots[i] for i in missing]),
                                strict=True):
                known[i] = value
                self.remember(keys[i], value)
        return cast("list[int]", known)  # every None was filled

    def remember(self, key: BlockKey, value: int) -> None:
        """`value` is the sum of the bytes `key` has (or is about to have: a push
        remembered before the pool takes it, so that an eviction from then on
        forgets it) in the pool. The server's thread."""
        if not self.cached:
            return
        sums = self._sums
        if key not in sums and len(sums) >= self._limit:
            sums.pop(next(iter(sums)))  # bounded: the oldest goes
        sums[key] = value

    def forget(self, key: BlockKey) -> None:
        """The pool does not hold the bytes remembered for `key` (the server's thread)."""
        self._sums.pop(key, None)

    def left_pool(self, keys: Sequence[BlockKey]) -> None:
        """The parent's thread, as `keys` leave the pool: their sums are stale. O(1)
        per key; bounded: past two per slot, every sum goes instead."""
        sums, stale = self._sums, self._stale
        for key in keys:
            if key in sums:
                if len(stale) >= 2 * self._limit:
                    self._lost = True
                    return
                stale.append(key)

    def _drop_stale(self) -> None:
        sums, stale = self._sums, self._stale
        if self._lost:
            self._lost = False
            sums.clear()
            stale.clear()
            return
        while stale:
            sums.pop(stale.popleft(), None)
