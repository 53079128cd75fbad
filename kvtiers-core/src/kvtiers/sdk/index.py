"""`BoundedIndex`: what a tier holds, where, and what it may evict - with the
capacity bound, pins and reservations every tier needs, in one place.

- **entries**: key (`bytes`) -> location (any value: a file name, a row id, the
  bytes themselves) and size in bytes. Only committed entries are visible
  (`get`, `in`): a `HIT` is never answered before the bytes are in the tier.
- **eviction policy**: any registered `EvictionPolicy` (built with
  `ctx.make_policy`, see `for_tier`) orders the entries. The policy's boolean
  `pin`/`unpin` is driven from here; the index owns the reference counts.
- **pins**: `pin(keys)` takes entries out of eviction until the returned `Pins`
  is released (a load pins at submit what `lookup` called a HIT). Pins nest.
- **reservations**: `reserve(items)` counts a store job's bytes against capacity
  before its copy starts, evicting unpinned entries to make room; it never evicts
  a pinned entry or one of the job's own keys (those it found present are pinned
  until the reservation closes, and so are those it commits). A job larger than
  the tier gets `FULL` for the keys that do not fit, never its own blocks evicted.
- **removals**: every entry that leaves (evicted, removed, cleared) is passed to
  `on_removed` (`ctx.events.removed` for `for_tier`), outside the lock; evicted
  entries are also returned to the caller, who deletes their storage.
- **recency**: `export()` is a JSON-ready list of hex keys, oldest first;
  `restore()` takes it back after the entries are re-added at start-up.

Memory (a tier may hold millions of entries): an entry is one `(location, size)`
tuple in one dict - no object of the index's own per entry, nothing the garbage
collector keeps tracking (a tuple of atoms is untracked at its first collection), so
a full collection never walks the entries; entries whose location is an `int` or
None share their tuple with every equal one (a tier whose location is the size has
none at all). Pin counts are kept only for pinned entries. The dict keeps the entries
in order of use (an insert or a touch makes an entry the last): `iter_items` walks it.
The containers themselves (this dict, the policy's) are tracked, and the collector
walks every container of a generation it collects: born young and filled by a
start-up load that allocates almost nothing tracked, they would stay young until
the first busy phase, whose first generation-1 collection would then walk a million
entries at once (~50 ms holding the GIL, on whichever thread). So the constructor
moves them to the oldest generation while they are empty (`_age_fresh_containers`).

Thread-safe. One lock guards all state and is held only for O(1) work per key
touched (so the scheduler thread may call `get`, `touch`, `pin`); `export` copies
the order under the lock and encodes outside it; `view` (tests, tools) copies.

**queued** (`queued=True`): for a tier whose own threads do long work under the
lock - replaying a shared journal, exporting the order of a million entries for a
snapshot - `pin`, `Pins.release` and `touch` never take the lock: they append to a
queue (lock-free) that the next call taking the lock applies first (or `pin`/`touch`
themselves once it is long, if the lock is free right then: amortised O(1)). So
the scheduler never waits for that work, and an eviction still sees every pin
queued before it. `Pins.locations` is read at `pin` time.

**fed from outside** (a tier on shared storage, whose decisions are in a journal
that several processes append to): `adopt` inserts entries another process
committed without evicting for them; `hold`/`release` count bytes of stores in
flight that are not this index's reservations (another process's intents, or the
tier's own journaled ones), evicting for them when asked; `order`/`items` list the entries,
`iter_items` in pieces without copying them (a snapshot of a million entries). kvtiers-fs
keeps its namespace index this way.
"""

from __future__ import annotations

import gc
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.sdk.index_parts import EntryView, IndexView, Pins, Reservation, Verdict, _PinCount

if TYPE_CHECKING:
    from kvtiers.contract.tier import TierContext

__all__ = ["BoundedIndex", "EntryView", "IndexView", "Pins", "Reservation", "Verdict"]

L = TypeVar("L")

#: called with the keys of entries that left the index (outside its lock)
RemovedFn = Callable[[list[bytes]], None]

_PIN, _UNPIN, _TOUCH = 0, 1, 2
#: queued mode: `pin`/`touch` apply the queue themselves past this length (lock free)
DRAIN_AT = 256
#: queued mode: touches beyond this many queued operations are dropped (recency is
#: best effort; pins and releases are never dropped)
MAX_QUEUED = 1 << 16
#: distinct `(location, size)` tuples shared between entries at most (int/None locations)
MAX_SHARED = 1 << 10


class BoundedIndex(Generic[L]):
    """See the module doc. `capacity_bytes` bounds committed + reserved bytes."""

    def __init__(self, policy: EvictionPolicy, capacity_bytes: int, *,
                 on_removed: RemovedFn | None = None, queued: bool = False):
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be >= 1, got {capacity_bytes}")
        self._queued = queued
        self._ops: deque[tuple[int, Any]] = deque()
        self._policy = policy
        self._capacity = capacity_bytes
        self._on_removed = on_removed
        self._lock = threading.Lock()
        self._entries: dict[bytes, tuple[L, int]] = _tracked_dict()  # key -> (location, size)
        self._pins: dict[bytes, _PinCount] = {}  # pinned entries only
        self._shared: dict[tuple[Any, int], tuple[Any, int]] = {}  # see `_entry`
        self._committed = 0
        self._reserved = 0
        self._evictable = 0
        self._evictions = 0
        _age_fresh_containers()

    @classmethod
    def for_tier(cls, ctx: TierContext, *, policy: str, capacity_bytes: int,
                 entry_bytes: int | None = None) -> BoundedIndex[Any]:
        """An index with the registered policy `policy` (sized for
        `capacity_bytes // entry_bytes` entries; default entry size: the context's
        block bytes) that reports removals to `ctx.events`."""
        per = entry_bytes or ctx.block_bytes
        return cls(ctx.make_policy(policy, max(1, capacity_bytes // per)), capacity_bytes,
                   on_removed=ctx.events.removed)

    # Cheap reads (no lock: single attribute loads).

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def committed_bytes(self) -> int:
        return self._committed

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    @property
    def evictions(self) -> int:
        return self._evictions

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: bytes) -> L | None:
        """The location of committed `key`, or None."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    # Scheduler-thread operations: O(1) per key.

    def touch(self, keys: Iterable[bytes]) -> None:
        """Record a use of each present key (queued mode: when the queue is applied)."""
        if self._queued:
            if len(self._ops) < MAX_QUEUED:
                self._ops.append((_TOUCH, list(keys)))
            self._drain_if_long()
            return
        with self._lock:
            self._touch_locked(keys)

    def pin(self, keys: Sequence[bytes]) -> Pins[L]:
        """Pin the present `keys` (reference-counted) until the result is released.
        Queued mode: the pins apply when the queue does (always before an eviction)."""
        held: list[tuple[bytes, _PinCount]] = []
        locations: list[L | None] = []
        if self._queued:
            entries = self._entries
            for key in keys:
                entry = entries.get(key)
                locations.append(None if entry is None else entry[0])
            pins = Pins(self, keys, held, locations)
            self._ops.append((_PIN, pins))
            self._drain_if_long()
            return pins
        with self._lock:
            self._pin_many_locked(keys, held, locations)
        return Pins(self, keys, held, locations)

    # Store path (I/O threads).

    def reserve(self, items: Sequence[tuple[bytes, int]]) -> Reservation[L]:
        """Verdicts for a store job's `(key, size)` items (keys distinct), in order:
        present keys are touched and pinned for the job; new keys get room counted,
        evicting unpinned entries (never the job's own) or `FULL` when even that
        cannot make room. O(1) per item and per eviction."""
        verdicts: list[Verdict] = []
        sizes: dict[bytes, int] = {}
        held: list[tuple[bytes, _PinCount]] = []
        evicted: list[tuple[bytes, L]] = []
        with self._lock:
            self._drain_locked()
            entries = self._entries
            # Present keys first: pinned, they cannot be evicted for the job's others.
            present = [key for key, _ in items if key in entries]
            if present:
                self._touch_locked(present)
                self._pin_many_locked(present, held, None)
            capacity, make_room = self._capacity, self._make_room_locked
            for key, size in items:
                if key in entries:
                    verdicts.append(Verdict.PRESENT)
                elif (self._committed + self._reserved + size <= capacity
                      or make_room(size, evicted)):  # (the first: `make_room`'s fast path)
                    self._reserved += size
                    sizes[key] = size
                    verdicts.append(Verdict.RESERVED)
                else:
                    verdicts.append(Verdict.FULL)
        self._removed([k for k, _ in evicted])
        return Reservation(self, [k for k, _ in items], verdicts, sizes, held, evicted)

    def add(self, key: bytes, location: L, size: int) -> list[tuple[bytes, L]]:
        """Insert a committed entry now (a start-up scan, a block found on shared
        storage): newest in recency, evicting unpinned entries to fit. Returns the
        entries that do not fit any more - evicted ones, or this one when it cannot
        fit - so the caller deletes their storage. Raises KeyError if present."""
        evicted: list[tuple[bytes, L]] = []
        with self._lock:
            self._drain_locked()
            if key in self._entries:
                raise KeyError(f"{key.hex()} is in the index already")
            fits = self._make_room_locked(size, evicted)
            if fits:
                self._insert_locked(key, self._entry(location, size))
        self._removed([k for k, _ in evicted])
        return evicted if fits else [*evicted, (key, location)]

    def remove(self, key: bytes, location: Any = ...) -> L | None:
        """Forget `key` (pinned or not) - only if its location equals `location`,
        when given (drop the copy found corrupt, not a newer one). Its location, or
        None when nothing was removed."""
        with self._lock:
            self._drain_locked()
            entry = self._entries.get(key)
            if entry is None or (location is not ... and entry[0] != location):
                return None
            self._drop_locked(key, entry)
        self._removed([key])
        return entry[0]

    def clear(self) -> list[tuple[bytes, L]]:
        """Forget every entry (reservations in flight keep their bytes)."""
        with self._lock:
            self._drain_locked()
            gone = [(k, e[0]) for k, e in self._entries.items()]
            for key, entry in list(self._entries.items()):
                self._drop_locked(key, entry)
        self._removed([k for k, _ in gone])
        return gone

    # Fed from outside (shared storage: see the module doc). The caller's threads.

    def adopt(self, items: Iterable[tuple[bytes, L, int]]) -> int:
        """Insert committed entries `(key, location, size)` as they are, without
        evicting: the storage holds them already and whoever put them there made
        room (another process's commits read from a journal; a start-up load). Each
        becomes the newest; a key present is left as it is. Usage may pass the
        capacity for a while (the next `reserve`/`hold` evicts first). One lock
        hold for all: pass pieces. Returns how many were inserted."""
        n = added = 0
        with self._lock:
            self._drain_locked()
            entries, insert, entry = self._entries, self._policy.insert, self._entry
            last: tuple[L, int] = entry(cast(L, None), 0)
            for key, location, size in items:  # `_insert_locked`, inlined: start-up speed
                if key not in entries:
                    if location is not last[0] or size is not last[1]:
                        last = entry(location, size)  # (the same objects: the same tuple)
                    entries[key] = last
                    insert(key)
                    added += size
                    n += 1
            self._committed += added
            self._evictable += added
        return n

    def hold(self, size: int, *, evict: bool = True) -> list[tuple[bytes, L]] | None:
        """Count `size` bytes against capacity for a store in flight that is not a
        `reserve` of this index (another process's intent; the tier's own, when its
        reservation must be journaled first). With `evict`, unpinned entries are
        evicted to make room (returned, and reported to `on_removed`, as for
        `reserve`), and None means it cannot fit (nothing evicted, nothing counted);
        without, the bytes are counted whatever the usage (room was made elsewhere).
        `release` the bytes when that store ends."""
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        evicted: list[tuple[bytes, L]] = []
        with self._lock:
            self._drain_locked()
            if evict and not self._make_room_locked(size, evicted):
                return None
            self._reserved += size
        self._removed([k for k, _ in evicted])
        return evicted

    def release(self, size: int) -> None:
        """Give back `size` bytes counted by `hold` (that store committed - `adopt`
        its entry - or failed)."""
        with self._lock:
            if size > self._reserved:
                raise ValueError(f"release of {size} bytes, {self._reserved} held")
            self._reserved -= size

    def size_of(self, key: bytes) -> int | None:
        """The size of committed `key`, or None (lock-free)."""
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def order(self) -> list[bytes]:
        """Committed keys in eviction order (victims first, pinned last): `export`
        before encoding. O(entries) under the lock: in queued mode the scheduler's
        calls do not wait for it."""
        with self._lock:
            self._drain_locked()
            return cast(list[bytes], self._policy.export())  # a new list: the caller's

    def items(self) -> list[tuple[bytes, L, int]]:
        """Committed entries `(key, location, size)` in eviction order (as `order`),
        for a snapshot of the index. O(entries) under the lock."""
        with self._lock:
            self._drain_locked()
            entries = self._entries
            return [(k, e[0], e[1]) for k in self._policy.export()
                    if (e := entries.get(k)) is not None]

    def iter_items(self, piece: int = 256) -> Generator[list[tuple[bytes, L, int]], None, None]:
        """Committed entries `(key, location, size)` in order of use (oldest first:
        the order an LRU policy evicts in), in lists of `piece`, without copying the
        index: for a snapshot of a million entries, written piece by piece with the
        GIL given away in between (the caller's pauses). Queued mode: holds the lock
        from the first piece until exhausted or closed - the scheduler's pins,
        releases and touches queue meanwhile, and the caller must call no method
        that takes the lock before then (it would deadlock). Otherwise the entries
        are copied under the lock first (O(entries): other callers would wait)."""
        if not self._queued:
            with self._lock:
                self._drain_locked()
                copied = [(k, e[0], e[1]) for k, e in self._entries.items()]
            for at in range(0, len(copied), piece):
                yield copied[at : at + piece]
            return
        with self._lock:
            self._drain_locked()
            it = iter(self._entries.items())  # unchanged while the lock is held
            while chunk := list(islice(it, piece)):
                yield [(k, e[0], e[1]) for k, e in chunk]

    def apply_queued(self) -> int:
        """Queued mode: apply the queued pins, releases and touches now (every call
        that takes the lock does so first). Returns how many operations applied."""
        with self._lock:
            return self._drain_locked()

    @property
    def queued(self) -> int:
        """Operations waiting to be applied (queued mode)."""
        return len(self._ops)

    # Recency.

    def export(self) -> list[str]:
        """Keys in eviction order (victims first, pinned last) as hex strings:
        JSON-ready. The order is copied under the lock and encoded outside it."""
        return [bytes(k).hex() for k in self.order()]

    def restore(self, state: Iterable[Any]) -> int:
        """Apply an `export()`: the entries it names (present now) become the
        newest, in its order; entries it does not name keep their order before
        them. Call after re-adding the entries at start-up. Returns how many keys
        were applied; raises ValueError for anything not a hex string."""
        keys: dict[bytes, None] = {}
        for item in state:
            if not isinstance(item, str):
                raise ValueError(f"recency entries are hex strings, got {item!r:.80}")
            try:
                keys[bytes.fromhex(item)] = None
            except ValueError:
                raise ValueError(f"recency entry is not hex: {item!r:.80}") from None
        with self._lock:
            self._drain_locked()
            entries, policy, pins = self._entries, self._policy, self._pins
            named = [k for k in keys if k in entries]
            chosen = set(named)
            rest = [k for k in policy.export() if k not in chosen and k in entries]
            for key in entries:
                policy.remove(key)
            for key in (*rest, *named):
                policy.insert(key)
                if key in pins:
                    policy.pin(key)
            order = dict.fromkeys((*rest, *named))  # the use order too (any others first)
            self._entries = {**{k: e for k, e in entries.items() if k not in order},
                             **{k: entries[k] for k in order}}
        return len(named)

    def view(self) -> IndexView[L]:
        """A copy of the whole state: O(entries) - tests and tools only."""
        with self._lock:
            self._drain_locked()
            pins = self._pins
            entries = {k: EntryView(e[0], e[1], p.count if (p := pins.get(k)) else 0)
                       for k, e in self._entries.items()}
            order = list(self._policy.export())
            return IndexView(entries, order, self._capacity, self._committed,
                             self._reserved, self._evictable, self._evictions)

    # Internals: `_locked` methods hold the lock.

    def _entry(self, location: L, size: int) -> tuple[L, int]:
        """The `(location, size)` tuple of a new entry: one shared by all equal entries
        when the location is an int or None (up to `MAX_SHARED` distinct ones)."""
        entry = (location, size)
        if location is None or type(location) is int:
            shared = self._shared
            got = shared.get(entry)
            if got is not None:
                return cast(tuple[L, int], got)
            if len(shared) < MAX_SHARED:
                shared[entry] = entry
        return entry

    def _release(self, pins: Pins[L]) -> None:
        if self._queued:
            self._ops.append((_UNPIN, pins))
            self._drain_if_long()
            return
        with self._lock:
            self._unpin_locked(pins._held)
            pins._held = []

    def _touch_locked(self, keys: Iterable[bytes]) -> None:
        entries, pop = self._entries, self._entries.pop
        touched = []
        for key in keys:
            entry = pop(key, None)
            if entry is not None:
                entries[key] = entry  # the newest in use order
                touched.append(key)
        if touched:
            self._policy.touch_many(touched)

    def _pin_many_locked(self, keys: Iterable[bytes], held: list[tuple[bytes, _PinCount]],
                         locations: list[L | None] | None) -> None:
        """Pin each present key of `keys` once more (reference-counted; one policy
        call for those newly pinned): their counts go to `held`, every key's location
        (None: absent) to `locations` when given."""
        entries, pins = self._entries, self._pins
        new: list[bytes] = []
        unpinned = 0
        for key in keys:
            entry = entries.get(key)
            if entry is None:
                if locations is not None:
                    locations.append(None)
                continue
            count = pins.get(key)
            if count is None:
                count = pins[key] = _PinCount()
                new.append(key)
                unpinned += entry[1]
            count.count += 1
            held.append((key, count))
            if locations is not None:
                locations.append(entry[0])
        if new:
            self._policy.pin_many(new)
            self._evictable -= unpinned

    def _drain_locked(self) -> int:
        """Apply the queued operations there are now (the queue may grow meanwhile)."""
        ops = self._ops
        n = len(ops)
        for _ in range(n):
            op, arg = ops.popleft()
            if op == _TOUCH:
                self._touch_locked(arg)
            elif op == _PIN:
                self._pin_many_locked(arg.keys, arg._held, None)
            else:
                self._unpin_locked(arg._held)
                arg._held = []
        return n

    def _drain_if_long(self) -> None:
        if len(self._ops) > DRAIN_AT and self._lock.acquire(blocking=False):
            try:
                self._drain_locked()
            finally:
                self._lock.release()

    def _unpin_locked(self, held: Iterable[tuple[bytes, _PinCount]]) -> None:
        pins, entries = self._pins, self._entries
        freed: list[bytes] = []
        size = 0
        for key, count in held:
            count.count -= 1
            # An entry removed while pinned left the policy, the counts and `_pins`
            # already (a count no longer in `_pins` is that entry's, not a newer one's).
            if count.count == 0 and pins.get(key) is count:
                del pins[key]
                freed.append(key)
                size += entries[key][1]
        if freed:
            self._policy.unpin_many(freed)
            self._evictable += size

    def _insert_locked(self, key: bytes, entry: tuple[L, int]) -> None:
        self._entries[key] = entry
        self._committed += entry[1]
        self._evictable += entry[1]
        self._policy.insert(key)

    def _drop_locked(self, key: bytes, entry: tuple[L, int]) -> None:
        del self._entries[key]
        self._committed -= entry[1]
        if self._pins.pop(key, None) is None:
            self._evictable -= entry[1]
        self._policy.remove(key)

    def _make_room_locked(self, size: int, evicted: list[tuple[bytes, L]]) -> bool:
        """Evict until `size` more bytes fit; False (nothing evicted) if they cannot."""
        over = self._committed + self._reserved + size - self._capacity
        if over <= 0:
            return True
        if size > self._capacity or over > self._evictable:
            return False
        entries, policy, pins = self._entries, self._policy, self._pins
        tries = len(entries) + 1  # a policy that ignores pins must not make us spin
        while over > 0 and tries > 0:
            tries -= 1
            victims = policy.evict(1)
            if not victims:  # the policy lost entries it should hold: refuse
                return False
            key = cast(bytes, victims[0])
            entry = entries.get(key)
            if entry is None:
                continue  # not ours (a policy bug): it is gone from the policy now
            if key in pins:  # the policy ignored a pin: keep the entry, pinned
                policy.insert(key)
                policy.pin(key)
                continue
            location, size_ = entry
            del entries[key]
            self._committed -= size_
            self._evictable -= size_
            self._evictions += 1
            evicted.append((key, location))
            over -= size_
        return over <= 0

    def _commit(self, key: bytes, location: L, size: int,
                held: list[tuple[bytes, _PinCount]]) -> bool:
        """`_commit_many` of one key (the same steps, without the lists)."""
        with self._lock:
            self._drain_locked()
            self._reserved -= size
            if key in self._entries:
                return False
            self._entries[key] = self._entry(location, size)
            self._committed += size
            count = self._pins[key] = _PinCount()
            count.count = 1
            held.append((key, count))
            self._policy.insert(key)
            self._policy.pin(key)
            return True

    def _commit_many(self, keys: Sequence[bytes], locations: Sequence[L], sizes: list[int],
                     held: list[tuple[bytes, _PinCount]], *,
                     end: int | None = None) -> list[bool]:
        """Commit each `(keys[i], locations[i], sizes[i])` in order under one lock:
        its reserved bytes go; an absent key is inserted pinned for the job (not
        evictable until it ends), a present one is left (False). One policy call.
        With `end` (the reservation's bytes not committed), the reservation ends in
        the same lock round: the new entries go in unpinned, `held` is unpinned."""
        done: list[bool] = []
        new: list[bytes] = []
        with self._lock:
            self._drain_locked()
            entries, pins, entry = self._entries, self._pins, self._entry
            added = 0
            last: tuple[L, int] = entry(cast(L, None), 0)
            for key, location, size in zip(keys, locations, sizes, strict=True):
                if key in entries:
                    done.append(False)
                    continue
                if location is not last[0] or size != last[1]:
                    last = entry(location, size)  # (the same objects: the same tuple)
                entries[key] = last
                added += size
                new.append(key)
                done.append(True)
                if end is None:  # the job's own: not evictable until it ends
                    count = pins[key] = _PinCount()
                    count.count = 1
                    held.append((key, count))
            self._reserved -= sum(sizes)
            self._committed += added
            if end is None:
                if new:
                    self._policy.insert_pinned(new, [None] * len(new))
                return done
            self._reserved -= end
            self._unpin_locked(held)  # (first, as `close` after `commit_many` would)
            self._evictable += added
            insert = self._policy.insert
            for key in new:
                insert(key)
        return done

    def _end_reservation(self, released: int, held: list[tuple[bytes, _PinCount]]) -> None:
        with self._lock:
            self._drain_locked()
            self._reserved -= released
            self._unpin_locked(held)

    def _removed(self, keys: list[bytes]) -> None:
        if keys and self._on_removed is not None:
            self._on_removed(keys)


def _tracked_dict() -> dict[Any, Any]:
    """An empty dict the collector tracks already. (A new dict is untracked until
    something tracked goes in - here the first `(location, size)` tuple, in the middle
    of a start-up load - and it joins the youngest generation only then.)"""
    d: dict[Any, Any] = {None: []}
    del d[None]
    return d


def _age_fresh_containers() -> None:
    """Move the young generations' survivors - the containers just built, still
    empty - to the oldest generation: a generation-1 collection, which the
    interpreter runs every few thousand allocations anyway (its cost is that of the
    young objects: small now, ~50 ms per million entries once filled). An engine that
    turned the collector off keeps it off."""
    if gc.isenabled():
        gc.collect(1)

