"""`Leases`: the blocks a puller's lookups leased on one peer (NIXL sessions).

A lookup that asks for a lease gets, for every key the server holds, the server's
slot and the block's checksum, the block pinned there for the lease's time: a load
of those keys READs them at once - no `Fetch` round trip, no pin on the load's
critical path. This keeps the leases of one session, per key and per lease, and
the blocks they hold (they count against the peer's pin budget like fetches).

Each leased key is read under its lease once: `take` hands a load the leased keys
it asks for (a load of exactly what one or more lookups leased, in order, at C
speed) and they leave the lease; a key asked again is fetched as before. The
server holds a lease's pins as one job: a lease is released when no load reads
under it and none of its keys is left (`finish`: the link says `Landed`), or when
it lapses (`expired`) or a fetch needs its share of the budget (`idle`) with no
load reading under it (the link says `Abort`). This side stops using a lease at
`until`, three quarters of the granted time after the lookup was sent - before the
server can end it; a lease ended anyway (the server restarted, the session
dropped) leaves blocks that fail their checksums: misses, never wrong bytes.

Threads: everything on the link's event loop (no lock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtiers.sdk import BlockKey

from kvtiers_p2p.wire.protocol import LookupReply, State

__all__ = ["Lease", "Leases", "Taken"]

#: the share of a granted lease this side uses (the rest covers the way there,
#: the server's clock starting later, and the READ itself)
USE_SHARE = 0.75


@dataclass(slots=True, eq=False)
class Lease:
    """Lookup `req`'s lease: `keys[j]` is pinned at the server's slot `slots[j]`,
    `sums[j]` its block's checksum; used until `until` (time.monotonic()).
    `left`: its keys no load took yet; `readers`: loads reading under it now."""

    req: int
    keys: list[BlockKey]
    slots: list[int]
    sums: list[int]
    until: float
    left: int = field(default=0)
    readers: int = field(default=0)


@dataclass(slots=True)
class Taken:
    """What `take` found for a load: `at[k]` is the index into the load's keys of
    a block at the server's `slots[k]` with checksum `sums[k]`; `leases`: the
    leases it reads under (given to `finish` when the load ends). `at` is None
    when every key of the load is leased, in order."""

    at: list[int] | None
    slots: list[int]
    sums: list[int]
    leases: list[Lease]


class Leases:
    """One session's leases on one peer. See the module docstring."""

    def __init__(self) -> None:
        # key -> (its lease, its index there); a key taken whole with its lease
        # stays here until the lease is released (`left` 0 says it is gone)
        self._by_key: dict[BlockKey, tuple[Lease, int]] = {}
        self._live: dict[int, Lease] = {}  # req -> every lease not released yet
        #: blocks the leases not released hold pinned at the server
        self.blocks = 0
        #: leases granted; loads that read under one; leases given back before
        #: every key was read (tests, stats)
        self.granted = self.used = self.unused = 0

    def grant(self, reply: LookupReply, keys: Sequence[BlockKey], sent_at: float
              ) -> list[int]:
        """Keep the lease of `reply` (to a lookup of `keys` sent at `sent_at`): the
        reqs to `Abort` (older leases none of whose keys is theirs any more)."""
        states = reply.states
        held = (list(keys) if states.count(State.PRESENT) == len(keys) else
                [k for k, st in zip(keys, states, strict=True) if st == State.PRESENT])
        lease = Lease(reply.req, held, reply.source_slots, reply.checksums,
                      sent_at + reply.lease_s * USE_SHARE, left=len(held))
        self._live[reply.req] = lease
        self.blocks += len(held)
        self.granted += 1
        by_key = self._by_key
        emptied = []
        for j, key in enumerate(held):  # a key leased again: the newest lease has it
            old = by_key.get(key)
            if old is not None and old[0].left:
                old[0].left -= 1
                if not old[0].left and not old[0].readers:
                    emptied.append(old[0])
            by_key[key] = (lease, j)
        return [old.req for old in emptied if self._release(old)]

    def take(self, keys: Sequence[BlockKey], now: float) -> Taken | None:
        """The leased blocks of a load of `keys` (None: none); they leave their
        leases, which the load reads under until `finish`."""
        if not self._by_key or not keys:
            return None
        whole = self._whole(keys if isinstance(keys, list) else list(keys), now)
        if whole is not None:
            return whole
        by_key = self._by_key
        at: list[int] = []
        slots: list[int] = []
        sums: list[int] = []
        mine: list[Lease] = []
        for i, entry in enumerate(map(by_key.get, keys)):
            if entry is None:
                continue
            lease, j = entry
            if not lease.left or lease.until <= now:
                continue
            key = keys[i]
            del by_key[key]
            lease.left -= 1
            if lease not in mine:
                lease.readers += 1
                mine.append(lease)
            at.append(i)
            slots.append(lease.slots[j])
            sums.append(lease.sums[j])
        if not mine:
            return None
        self.used += 1
        return Taken(at, slots, sums, mine)

    def finish(self, leases: Sequence[Lease]) -> list[int]:
        """The load that took `leases` ended: the reqs to say `Landed` for."""
        out = []
        for lease in leases:
            lease.readers -= 1
            if lease.readers == 0 and not lease.left and self._release(lease):
                out.append(lease.req)
        return out

    def expired(self, now: float) -> list[int]:
        """Leases this side stopped using that no load reads under: the reqs to
        `Abort`."""
        lapsed = [lease for lease in self._live.values()
                  if lease.until <= now and not lease.readers]
        return [lease.req for lease in lapsed if self._unused(lease)]

    def idle(self, blocks: int) -> list[int]:
        """Give back leases no load reads under, oldest first, until at least
        `blocks` are free of them or none is left: the reqs to `Abort`."""
        out = []
        for lease in list(self._live.values()):
            if blocks <= 0:
                break
            if not lease.readers:
                blocks -= len(lease.keys)
                if self._unused(lease):
                    out.append(lease.req)
        return out

    def clear(self) -> None:
        """The session ended (the server dropped its pins): forget every lease."""
        self._live.clear()
        self._by_key.clear()
        self.blocks = 0

    def __len__(self) -> int:
        return len(self._live)

    def _whole(self, keys: list[BlockKey], now: float) -> Taken | None:
        """The common case at C speed: a load of what one or more lookups leased,
        whole and in order (the probe's first batch may be a key or two, the next
        the rest) - compared lease by lease, not key by key."""
        by_key, n, pos = self._by_key, len(keys), 0
        run: list[Lease] = []
        while pos < n:
            entry = by_key.get(keys[pos])
            if entry is None or entry[1] != 0:
                return None
            lease = entry[0]
            m = len(lease.keys)
            if lease.left != m or lease.readers or lease.until <= now or lease in run or (
                    keys[pos:pos + m] if pos or m != n else keys) != lease.keys:
                return None
            run.append(lease)
            pos += m
        for lease in run:
            lease.left = 0  # its keys stay in `_by_key` until it is released
            lease.readers = 1
        self.used += 1
        if len(run) == 1:
            return Taken(None, run[0].slots, run[0].sums, run)
        slots: list[int] = []
        sums: list[int] = []
        for lease in run:
            slots.extend(lease.slots)
            sums.extend(lease.sums)
        return Taken(None, slots, sums, run)

    def _unused(self, lease: Lease) -> bool:
        """Release `lease` before all its keys were read."""
        if lease.left:
            self.unused += 1
        return self._release(lease)

    def _release(self, lease: Lease) -> bool:
        """Forget `lease`; False when it was released already (or its session
        ended)."""
        if self._live.get(lease.req) is not lease:
            return False
        del self._live[lease.req]
        self.blocks -= len(lease.keys)
        by_key = self._by_key
        for key in lease.keys:
            entry = by_key.get(key)
            if entry is not None and entry[0] is lease:
                del by_key[key]
        return True
