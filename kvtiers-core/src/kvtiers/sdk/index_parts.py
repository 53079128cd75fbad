"""What a `BoundedIndex` (`kvtiers.sdk.index`) hands out and shows: the `Verdict` of
a reservation, `Pins`, the `Reservation` of a store job, and the `IndexView` copy.
Their methods call back into the index, which owns every count."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = ["EntryView", "IndexView", "Pins", "Reservation", "Verdict"]

L = TypeVar("L")


class Verdict(enum.Enum):
    """What `reserve` decided for one key of a store job."""

    PRESENT = "present"  # committed already: nothing to copy (touched, pinned for the job)
    RESERVED = "reserved"  # room is counted for it: copy, then `commit`
    FULL = "full"  # cannot fit without evicting pinned entries or the job's own


class _PinCount:
    """The pin count of one pinned entry (`BoundedIndex._pins`); a release finds it
    by identity, so that it never unpins a newer entry under the same key."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class _Owner(Protocol[L]):
    """What `Pins` and `Reservation` call back: the index that made them (a
    `BoundedIndex`), which owns every count. A Protocol, so that this module does
    not import the index."""

    def _release(self, pins: Pins[L]) -> None: ...

    def _commit(self, key: bytes, location: L, size: int,
                held: list[tuple[bytes, _PinCount]]) -> bool: ...

    def _commit_many(self, keys: Sequence[bytes], locations: Sequence[L], sizes: list[int],
                     held: list[tuple[bytes, _PinCount]], *,
                     end: int | None = None) -> list[bool]: ...

    def _end_reservation(self, released: int, held: list[tuple[bytes, _PinCount]]) -> None: ...


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
    reserved_bytes: int  # counted for stores in flight (reservations, holds), not committed
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

    __slots__ = ("keys", "locations", "_index", "_held", "_released")

    def __init__(self, index: _Owner[L], keys: Sequence[bytes],
                 held: list[tuple[bytes, _PinCount]], locations: list[L | None]):
        self.keys = keys
        self.locations = locations
        self._index = index
        # entries pinned (in queued mode: filled when the queue is applied)
        self._held = held
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._index._release(self)

    def __enter__(self) -> Pins[L]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Reservation(Generic[L]):
    """Room for one store job (`BoundedIndex.reserve`). `verdicts[i]` is the verdict
    for `keys[i]`; `evicted` are the entries evicted to make room (delete their
    storage). `commit` each key copied (or `commit_many` them: one lock round), then
    `close` (idempotent; also a context manager): it releases what was not committed
    and the job's pins."""

    __slots__ = ("keys", "verdicts", "evicted", "_index", "_sizes", "_held", "_open")

    def __init__(self, index: _Owner[L], keys: list[bytes], verdicts: list[Verdict],
                 sizes: dict[bytes, int], held: list[tuple[bytes, _PinCount]],
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

    def commit_many(self, keys: Sequence[bytes], locations: Sequence[L], *,
                    close: bool = False) -> list[bool]:
        """`commit(keys[i], locations[i])` for each i, in order, taking the index's
        lock once: what each returned. A key not reserved here (or given twice)
        raises KeyError after the keys before it are committed, as the loop would.
        With `close`, the reservation closes in the same lock round (a store's last
        commit): the entries committed are evictable at once, never pinned."""
        if not self._open:
            raise RuntimeError("commit on a closed reservation")
        if len(keys) != len(locations):
            raise ValueError(f"{len(keys)} keys, {len(locations)} locations")
        pop, sizes = self._sizes.pop, []
        try:
            for key in keys:
                sizes.append(pop(key))
        except KeyError:
            n = len(sizes)
            self._index._commit_many(keys[:n], locations[:n], sizes, self._held)
            raise
        if not close:
            return self._index._commit_many(keys, locations, sizes, self._held)
        self._open = False
        released = sum(self._sizes.values())
        self._sizes.clear()
        held, self._held = self._held, []
        return self._index._commit_many(keys, locations, sizes, held, end=released)

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
