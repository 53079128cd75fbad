"""`Leases`: the blocks a puller's lookups leased on one peer (NIXL sessions).

A lookup that asks for a lease gets, for every key the server holds, the server's
slot and the block's checksum, the block pinned there for the lease's time: a load
of those keys READs them at once - no `Fetch` round trip, no pin on the load's
critical path. This keeps the leases of one session, per key and per lease, and
the blocks they hold (they count against the peer's pin budget like fetches).

A lease is one-shot: the first load that uses any of its keys takes all of it
(`take`; keys of the lease that load does not want lose their lease and are
fetched as before) and releases it when it ends (`finish`: the link says `Landed`).
A lease no load took is given back when it lapses (`expired`) or when a fetch
needs its share of the budget (`idle`): the link says `Abort`. This side stops
using a lease at `until`, three quarters of the granted time after the lookup was
sent - before the server can end it; a lease ended anyway (the server restarted,
the session dropped) leaves blocks that fail their checksums: misses, never wrong
bytes.

Threads: everything on the link's event loop (no lock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtiers.keys import BlockKey

from kvtiers_p2p.protocol import LookupReply, State

__all__ = ["Lease", "Leases", "Taken"]

#: the share of a granted lease this side uses (the rest covers the way there,
#: the server's clock starting later, and the READ itself)
USE_SHARE = 0.75


@dataclass(slots=True, eq=False)
class Lease:
    """Lookup `req`'s lease: `keys[j]` is pinned at the server's slot `slots[j]`,
    `sums[j]` its block's checksum; used until `until` (time.monotonic())."""

    req: int
    keys: list[BlockKey]
    slots: list[int]
    sums: list[int]
    until: float
    taken: bool = field(default=False)
    released: bool = field(default=False)


@dataclass(slots=True)
class Taken:
    """What `take` found for a load: `at[k]` is the index into the load's keys of
    a block at the server's `slots[k]` with checksum `sums[k]`; `leases`: the
    leases taken (given to `finish` when the load ends). `at` is None when every
    key of the load is leased, in order."""

    at: list[int] | None
    slots: list[int]
    sums: list[int]
    leases: list[Lease]


class Leases:
    """One session's leases on one peer. See the module docstring."""

    def __init__(self) -> None:
        self._by_key: dict[BlockKey, tuple[Lease, int]] = {}
        self._live: dict[int, Lease] = {}  # req -> every lease not released yet
        #: blocks the leases not released hold pinned at the server
        self.blocks = 0
        #: leases granted, taken by a load, given back unused (tests, stats)
        self.granted = self.used = self.unused = 0

    def grant(self, reply: LookupReply, keys: Sequence[BlockKey], sent_at: float) -> None:
        """Keep the lease of `reply` (to a lookup of `keys` sent at `sent_at`)."""
        states = reply.states
        held = (list(keys) if states.count(State.PRESENT) == len(keys) else
                [k for k, st in zip(keys, states, strict=True) if st == State.PRESENT])
        lease = Lease(reply.req, held, reply.source_slots, reply.checksums,
                      sent_at + reply.lease_s * USE_SHARE)
        self._live[reply.req] = lease
        self.blocks += len(held)
        self.granted += 1
        by_key = self._by_key
        for j, key in enumerate(held):  # a key leased again: the newest lease has it
            by_key[key] = (lease, j)

    def take(self, keys: Sequence[BlockKey], now: float) -> Taken | None:
        """The leased blocks of a load of `keys` (None: none), their leases taken."""
        by_key = self._by_key
        if not by_key or not keys:
            return None
        first = by_key.get(keys[0])
        if first is not None:  # the common case: a load of what one lookup leased
            lease = first[0]
            if not lease.taken and lease.until > now and first[1] == 0 and (
                    len(lease.keys) == len(keys)) and lease.keys == (
                    keys if isinstance(keys, list) else list(keys)):
                lease.taken = True
                self.used += 1
                return Taken(None, lease.slots, lease.sums, [lease])
        at: list[int] = []
        slots: list[int] = []
        sums: list[int] = []
        mine: list[Lease] = []
        for i, entry in enumerate(map(by_key.get, keys)):
            if entry is None:
                continue
            lease, j = entry
            if not lease.taken:
                if lease.until <= now:
                    continue
                lease.taken = True
                mine.append(lease)
            elif lease not in mine:  # another load's
                continue
            at.append(i)
            slots.append(lease.slots[j])
            sums.append(lease.sums[j])
        if not mine:
            return None
        self.used += len(mine)
        return Taken(at, slots, sums, mine)

    def finish(self, leases: Sequence[Lease]) -> list[int]:
        """The load that took `leases` ended: the reqs to say `Landed` for."""
        return [lease.req for lease in leases if self._release(lease)]

    def expired(self, now: float) -> list[int]:
        """Leases no load took that this side stopped using: the reqs to `Abort`."""
        lapsed = [lease for lease in self._live.values()
                  if not lease.taken and lease.until <= now]
        self.unused += len(lapsed)
        return [lease.req for lease in lapsed if self._release(lease)]

    def idle(self, blocks: int) -> list[int]:
        """Give back leases no load took, oldest first, until at least `blocks`
        are free of them or none is left: the reqs to `Abort`."""
        out = []
        for lease in list(self._live.values()):
            if self.blocks == 0 or blocks <= 0:
                break
            if not lease.taken:
                blocks -= len(lease.keys)
                self.unused += 1
                if self._release(lease):
                    out.append(lease.req)
        return out

    def clear(self) -> None:
        """The session ended (the server dropped its pins): forget every lease."""
        for lease in self._live.values():
            lease.released = True
        self._live.clear()
        self._by_key.clear()
        self.blocks = 0

    def __len__(self) -> int:
        return len(self._live)

    def _release(self, lease: Lease) -> bool:
        """Forget `lease`; False when it was released already."""
        if lease.released:
            return False
        lease.released = True
        self._live.pop(lease.req, None)
        self.blocks -= len(lease.keys)
        by_key = self._by_key
        for key in lease.keys:
            entry = by_key.get(key)
            if entry is not None and entry[0] is lease:
                del by_key[key]
        return True
