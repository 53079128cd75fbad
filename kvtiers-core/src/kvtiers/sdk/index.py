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

Thread-safe. One lock guards all state and is held only for O(1) work per key
touched (so the scheduler thread may call `get`, `touch`, `pin`); `export` copies
the order under the lock and encodes outside it; `view` (tests, tools) copies.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from kvtiers.policies.base import EvictionPolicy

if TYPE_CHECKING:
    from kvtiers.tier import TierContext

__all__ = ["BoundedIndex", "EntryView", "IndexView", "Pins", "Reservation", "Verdict"]

L = TypeVar("L")

#: called with the keys of entries that left the index (outside its lock)
RemovedFn = Callable[[list[bytes]], None]


class Verdict(enum.Enum):
    """What `reserve` decided for one key of a store job."""

    PRESENT = "present"  # committed already: nothing to copy (touched, pinned for the job)
    RESERVED = "reserved"  # room is counted for it: copy, then `commit`
    FULL = "full"  # cannot fit without evicting pinned entries or the job's own


class _Entry(Generic[L]):
    __slots__ = ("location", "size", "pins")

    def __init__(self, location: L, size: int):
        self.location = location
        self.size = size
        self.pins = 0


@dataclass(frozen=True, slots=True)
class EntryView(Generic[L]):
    location: L
    size: int
    pins: int


@dataclass(frozen=True, slots=True)
class IndexView(Generic[L]):
    """A copy of an index's state (`BoundedIndex.view`), for tests and tools."""

    entries: Mapping[bytes, EntryView[L]]
    #: keys in eviction order (the policy's export: victims first, pinned last)
    order: Sequence[bytes]
    capacity_bytes: int
    committed_bytes: int  # sizes of the entries
    reserved_bytes: int  # counted for stores in flight, not committed yet
    evictable_bytes: int  # committed and unpinned
    evictions: int  # entries evicted since the index was made

    @property
    def used_bytes(self) -> int:
        """What counts against capacity: committed plus reserved."""
        return self.committed_bytes + self.reserved_bytes


class Pins(Generic[L]):
    """Entries pinned by one caller (`BoundedIndex.pin`); `locations[i]` is the
    location of `keys[i]`, None where it was absent (nothing pinned for it).
    `release()` (idempotent) gives the pins back; also a context manager."""

    __slots__ = ("keys", "locations", "_index", "_held")

    def __init__(self, index: BoundedIndex[L], keys: Sequence[bytes],
                 held: list[tuple[bytes, _Entry[L]]], locations: list[L | None]):
        self.keys = keys
        self.locations = locations
        self._index = index
        self._held: list[tuple[bytes, _Entry[L]]] | None = held

    def release(self) -> None:
        held, self._held = self._held, None
        if held:
            self._index._unpin(held)

    def __enter__(self) -> Pins[L]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Reservation(Generic[L]):
    """Room for one store job (`BoundedIndex.reserve`). `verdicts[i]` is the verdict
    for `keys[i]`; `evicted` are the entries evicted to make room (delete their
    storage). `commit` each key copied, then `close` (idempotent; also a context
    manager): it releases what was not committed and the job's pins."""

    __slots__ = ("keys", "verdicts", "evicted", "_index", "_sizes", "_held", "_open")

    def __init__(self, index: BoundedIndex[L], keys: list[bytes], verdicts: list[Verdict],
                 sizes: dict[bytes, int], held: list[tuple[bytes, _Entry[L]]],
                 evicted: list[tuple[bytes, L]]):
        self.keys = keys
        self.verdicts = verdicts
        self.evicted = evicted
        self._index = index
        self._sizes = sizes  # RESERVED keys not committed yet -> reserved bytes
        self._held = held  # entries pinned for the job
        self._open = True

    def commit(self, key: bytes, location: L) -> bool:
        """The copy of a RESERVED `key` is in place at `location`: make it visible.
        False when another job committed the key meanwhile (the existing entry is
        kept; discard this copy). Raises KeyError for a key not reserved here."""
        if not self._open:
            raise RuntimeError("commit on a closed reservation")
        size = self._sizes.pop(key)
        return self._index._commit(key, location, size, self._held)

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        released = sum(self._sizes.values())
        self._sizes.clear()
        self._index._end_reservation(released, self._held)
        self._held = []

    def __enter__(self) -> Reservation[L]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BoundedIndex(Generic[L]):
    """See the module doc. `capacity_bytes` bounds committed + reserved bytes."""

    def __init__(self, policy: EvictionPolicy, capacity_bytes: int, *,
                 on_removed: RemovedFn | None = None):
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be >= 1, got {capacity_bytes}")
        self._policy = policy
        self._capacity = capacity_bytes
        self._on_removed = on_removed
        self._lock = threading.Lock()
        self._entries: dict[bytes, _Entry[L]] = {}
        self._committed = 0
        self._reserved = 0
        self._evictable = 0
        self._evictions = 0

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
        return None if entry is None else entry.location

    # Scheduler-thread operations: O(1) per key.

    def touch(self, keys: Iterable[bytes]) -> None:
        """Record a use of each present key."""
        with self._lock:
            entries, policy = self._entries, self._policy
            for key in keys:
                if key in entries:
                    policy.touch(key)

    def pin(self, keys: Sequence[bytes]) -> Pins[L]:
        """Pin the present `keys` (reference-counted) until the result is released."""
        held: list[tuple[bytes, _Entry[L]]] = []
        locations: list[L | None] = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    locations.append(None)
                    continue
                self._pin_locked(key, entry)
                held.append((key, entry))
                locations.append(entry.location)
        return Pins(self, keys, held, locations)

    # Store path (I/O threads).

    def reserve(self, items: Sequence[tuple[bytes, int]]) -> Reservation[L]:
        """Verdicts for a store job's `(key, size)` items (keys distinct), in order:
        present keys are touched and pinned for the job; new keys get room counted,
        evicting unpinned entries (never the job's own) or `FULL` when even that
        cannot make room. O(1) per item and per eviction."""
        verdicts: list[Verdict] = []
        sizes: dict[bytes, int] = {}
        held: list[tuple[bytes, _Entry[L]]] = []
        evicted: list[tuple[bytes, L]] = []
        with self._lock:
            entries = self._entries
            # Present keys first: pinned, they cannot be evicted for the job's others.
            for key, _ in items:
                entry = entries.get(key)
                if entry is not None:
                    self._policy.touch(key)
                    self._pin_locked(key, entry)
                    held.append((key, entry))
            for key, size in items:
                if key in entries:
                    verdicts.append(Verdict.PRESENT)
                elif self._make_room_locked(size, evicted):
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
            if key in self._entries:
                raise KeyError(f"{key.hex()} is in the index already")
            fits = self._make_room_locked(size, evicted)
            if fits:
                self._insert_locked(key, _Entry(location, size))
        self._removed([k for k, _ in evicted])
        return evicted if fits else [*evicted, (key, location)]

    def remove(self, key: bytes, location: Any = ...) -> L | None:
        """Forget `key` (pinned or not) - only if its location equals `location`,
        when given (drop the copy found corrupt, not a newer one). Its location, or
        None when nothing was removed."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or (location is not ... and entry.location != location):
                return None
            self._drop_locked(key, entry)
        self._removed([key])
        return entry.location

    def clear(self) -> list[tuple[bytes, L]]:
        """Forget every entry (reservations in flight keep their bytes)."""
        with self._lock:
            gone = [(k, e.location) for k, e in self._entries.items()]
            for key, entry in list(self._entries.items()):
                self._drop_locked(key, entry)
        self._removed([k for k, _ in gone])
        return gone

    # Recency.

    def export(self) -> list[str]:
        """Keys in eviction order (victims first, pinned last) as hex strings:
        JSON-ready. The order is copied under the lock and encoded outside it."""
        with self._lock:
            order = self._policy.export()
        return [bytes(k).hex() for k in order]

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
            entries, policy = self._entries, self._policy
            named = [k for k in keys if k in entries]
            chosen = set(named)
            rest = [k for k in policy.export() if k not in chosen and k in entries]
            for key in entries:
                policy.remove(key)
            for key in (*rest, *named):
                policy.insert(key)
                if entries[key].pins:
                    policy.pin(key)
        return len(named)

    def view(self) -> IndexView[L]:
        """A copy of the whole state: O(entries) - tests and tools only."""
        with self._lock:
            entries = {k: EntryView(e.location, e.size, e.pins)
                       for k, e in self._entries.items()}
            order = list(self._policy.export())
            return IndexView(entries, order, self._capacity, self._committed,
                             self._reserved, self._evictable, self._evictions)

    # Internals: `_locked` methods hold the lock.

    def _pin_locked(self, key: bytes, entry: _Entry[L]) -> None:
        entry.pins += 1
        if entry.pins == 1:
            self._policy.pin(key)
            self._evictable -= entry.size

    def _unpin(self, held: Iterable[tuple[bytes, _Entry[L]]]) -> None:
        with self._lock:
            self._unpin_locked(held)

    def _unpin_locked(self, held: Iterable[tuple[bytes, _Entry[L]]]) -> None:
        entries = self._entries
        for key, entry in held:
            entry.pins -= 1
            # An entry removed while pinned left the policy and the counts already.
            if entry.pins == 0 and entries.get(key) is entry:
                self._policy.unpin(key)
                self._evictable += entry.size

    def _insert_locked(self, key: bytes, entry: _Entry[L]) -> None:
        self._entries[key] = entry
        self._committed += entry.size
        self._evictable += entry.size
        self._policy.insert(key)

    def _drop_locked(self, key: bytes, entry: _Entry[L]) -> None:
        del self._entries[key]
        self._committed -= entry.size
        if not entry.pins:
            self._evictable -= entry.size
        self._policy.remove(key)

    def _make_room_locked(self, size: int, evicted: list[tuple[bytes, L]]) -> bool:
        """Evict until `size` more bytes fit; False (nothing evicted) if they cannot."""
        over = self._committed + self._reserved + size - self._capacity
        if over <= 0:
            return True
        if size > self._capacity or over > self._evictable:
            return False
        entries, policy = self._entries, self._policy
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
            if entry.pins:  # the policy ignored a pin: keep the entry, pinned
                policy.insert(key)
                policy.pin(key)
                continue
            del entries[key]
            self._committed -= entry.size
            self._evictable -= entry.size
            self._evictions += 1
            evicted.append((key, entry.location))
            over -= entry.size
        return over <= 0

    def _commit(self, key: bytes, location: L, size: int,
                held: list[tuple[bytes, _Entry[L]]]) -> bool:
        with self._lock:
            self._reserved -= size
            if key in self._entries:
                return False
            entry = _Entry(location, size)
            self._insert_locked(key, entry)
            self._pin_locked(key, entry)  # the job's own: not evictable until it ends
            held.append((key, entry))
            return True

    def _end_reservation(self, released: int, held: list[tuple[bytes, _Entry[L]]]) -> None:
        with self._lock:
            self._reserved -= released
            self._unpin_locked(held)

    def _removed(self, keys: list[bytes]) -> None:
        if keys and self._on_removed is not None:
            self._on_removed(keys)
