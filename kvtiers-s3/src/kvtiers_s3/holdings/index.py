"""`Holdings`: what the tier holds - objects in a `BoundedIndex`, and which object
holds each key.

The unit of capacity and eviction is the *object*: a block of the per-block layout,
or a whole packed segment. A segment's blocks were stored by one job (consecutive
blocks of a request's prefix, which age together) and leave together: evicting
one of them deletes the object, so the bytes counted are exactly the bytes stored,
never a segment kept alive by one block. The index's keys are object ids (a block's
own key, or `SEGMENT_TAG` + the segment's name); the key map sends each block key
to the object holding its live copy.

Threads: `lookup`, `pin` and `touch` are for the scheduler thread: dictionary
reads and the index's O(1) operations, never this class's lock. Everything else
(the tier's event loop, the probe thread) takes the lock for the key map, and is
O(1) per key it names. Removals are reported to `ctx.events` as block keys.

A *quarantined* object is one at a name the tier makes that it cannot read as its
own and cannot prove its own (`layout.proof`): another program's object, or one
damaged past proof. It holds no block (a lookup of its key is a miss), is never
deleted, and its bytes stay counted against the bound - so that what is listed
under the prefix never outgrows `capacity_bytes` - under an id of its own
(`QUARANTINE_TAG` + its name: a store of the key is not mistaken for it), pinned
(never evicted: eviction deletes). It is let go, undeleted, when its object changes
or is gone (a probe or a listing finds it so) or the tier writes that name itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvtiers.sdk import BlockKey, BoundedIndex, Pins, Reservation, TierContext

__all__ = ["QUARANTINE_TAG", "SEGMENT_TAG", "Holdings", "Member", "StoredObject",
           "quarantine_oid", "segment_oid"]

#: prefix of a segment's object id (block keys never start with a NUL and this)
SEGMENT_TAG = b"\x00kvtiers-s3 segment\x00"
#: prefix of a quarantined object's id
QUARANTINE_TAG = b"\x00kvtiers-s3 quarantined\x00"


def segment_oid(name: str) -> bytes:
    return SEGMENT_TAG + name.rsplit("/", 1)[-1].encode()


def quarantine_oid(name: str) -> bytes:
    return QUARANTINE_TAG + name.rsplit("/", 1)[-1].encode()


@dataclass(frozen=True, slots=True)
class Member:
    """Where one block's record lies in its object."""

    offset: int
    length: int
    checksum: int | None = None  # from a segment index; per-block records carry theirs


@dataclass(eq=False, slots=True)
class StoredObject:
    """One object of the tier's namespace (compared by identity)."""

    oid: bytes
    name: str
    size: int  # bytes on the store: what counts against capacity
    members: dict[BlockKey, Member]  # live blocks in it
    mtime: float  # wall-clock seconds when it was stored (ttl_s)
    packed: bool = False
    etag: str | None = None  # the store's ETag where known (listings, HEADs)
    #: index bytes of a segment (start-up read them; a load needs none)
    extra: dict[str, int] = field(default_factory=dict)


class Holdings:
    """See the module doc."""

    def __init__(self, ctx: TierContext, *, policy: str, capacity_bytes: int,
                 entry_bytes: int):
        self._events = ctx.events
        self.index: BoundedIndex[StoredObject] = BoundedIndex(
            ctx.make_policy(policy, max(1, capacity_bytes // max(1, entry_bytes))),
            capacity_bytes, on_removed=self._removed)
        self._keys: dict[BlockKey, StoredObject] = {}
        self._objects: dict[bytes, StoredObject] = {}
        self._quarantine: dict[str, Pins[StoredObject]] = {}  # name -> its pin
        self._lock = threading.RLock()

    # Scheduler thread.

    def lookup(self, key: BlockKey) -> StoredObject | None:
        """The object holding `key`'s live copy, or None. O(1), no lock."""
        obj = self._keys.get(key)
        if obj is None or self.index.get(obj.oid) is not obj:
            return None
        return obj

    def pin(self, keys: Sequence[BlockKey]) -> tuple[Pins[StoredObject], list[StoredObject | None]]:
        """Pin the objects of `keys` (each once) until the Pins are released; the
        object of each key, None where the tier does not hold it."""
        objects = [self.lookup(k) for k in keys]
        oids = list(dict.fromkeys(o.oid for o in objects if o is not None))
        pins = self.index.pin(oids)
        pinned = {id(loc) for loc in pins.locations if loc is not None}
        return pins, [o if o is not None and id(o) in pinned else None for o in objects]

    def touch(self, keys: Iterable[BlockKey]) -> None:
        oids = []
        for key in keys:
            obj = self._keys.get(key)
            if obj is not None:
                oids.append(obj.oid)
        if oids:
            self.index.touch(dict.fromkeys(oids))

    # The loop and the probe thread.

    def reserve(self, objects: Sequence[tuple[bytes, int]]) -> Reservation[StoredObject]:
        """Room for new objects `(oid, size)`; evicted objects are in the result's
        `evicted` (delete them) and already gone from the key map."""
        with self._lock:
            return self.index.reserve(objects)

    def commit(self, room: Reservation[StoredObject], obj: StoredObject) -> bool:
        """A new object is stored: make it and its blocks visible. False when its
        id was committed by someone else meanwhile (discard this copy)."""
        with self._lock:
            if not obj.packed:
                self.release(obj.name)  # overwritten by this store
            if not room.commit(obj.oid, obj):
                return False
            self._adopt(obj)
            return True

    def add(self, obj: StoredObject) -> list[StoredObject]:
        """An object found on the store (start-up, a probe). Returns the objects to
        delete: evicted to make room, or `obj` itself when it does not fit; an
        object whose id is held already is ignored (empty list)."""
        with self._lock:
            if not obj.packed:
                self.release(obj.name)  # a new object under a quarantined one's name
            return self._add_locked(obj)

    def drop(self, obj: StoredObject, key: BlockKey | None = None) -> bool:
        """Forget block `key` of `obj` (None: every block of it). True when the
        object holds no live block any more and has left the index: delete it."""
        with self._lock:
            keys = list(obj.members) if key is None else [key]
            gone = []
            for k in keys:
                if obj.members.pop(k, None) is not None and self._keys.get(k) is obj:
                    del self._keys[k]
                    gone.append(k)
            left = bool(obj.members) or self.index.remove(obj.oid, obj) is None
        if gone:
            self._events.removed(gone)
        return not left

    def quarantine(self, obj: StoredObject) -> list[StoredObject]:
        """`obj` (a block object this tier held) turned out not to be ours to read:
        its block leaves, its bytes stay counted as a quarantined object (module
        doc). Returns the objects evicted to keep it (delete them); nothing when
        `obj` has left the index meanwhile."""
        with self._lock:
            gone = [k for k in obj.members if self._keys.get(k) is obj]
            for k in gone:
                del self._keys[k]
            obj.members.clear()
            removed = []
            if self.index.remove(obj.oid, obj) is not None:
                removed = self._quarantine_locked(obj.name, obj.size, obj.mtime, obj.etag)
        if gone:
            self._events.removed(gone)
        return removed

    def quarantine_found(self, name: str, size: int, mtime: float | None,
                         etag: str | None) -> list[StoredObject]:
        """An object a listing found not ours to read: counted, quarantined (module
        doc). Returns the objects evicted to make room for it (delete them)."""
        with self._lock:
            return self._quarantine_locked(name, size, time.time() if mtime is None else mtime,
                                           etag)

    def quarantined(self, name: str) -> StoredObject | None:
        """The quarantined object named `name`, if held."""
        obj = self._objects.get(quarantine_oid(name))
        return obj if obj is not None and obj.name == name else None

    def quarantined_names(self) -> list[str]:
        """Every quarantined object's name (tools, tests)."""
        with self._lock:
            return list(self._quarantine)

    def release(self, name: str) -> None:
        """Let go of the quarantined object `name` (it changed, went, or the tier
        writes that name now): uncounted, undeleted."""
        if name not in self._quarantine:  # the common case, without the lock
            return
        with self._lock:
            obj = self.quarantined(name)
            if obj is not None:
                self.index.remove(obj.oid, obj)  # `_removed` gives its pin back

    def objects(self) -> list[StoredObject]:
        """Every object held (a copy; O(objects): start-up, tests)."""
        with self._lock:
            return list(self._objects.values())

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.lookup(key) is not None

    # Internals.

    def _add_locked(self, obj: StoredObject) -> list[StoredObject]:
        if obj.oid in self._objects:
            return []
        try:
            gone = self.index.add(obj.oid, obj, obj.size)
        except KeyError:
            return []
        if all(o is not obj for _, o in gone):
            self._adopt(obj)
        return [o for _, o in gone]

    def _quarantine_locked(self, name: str, size: int, mtime: float,
                           etag: str | None) -> list[StoredObject]:
        q = StoredObject(quarantine_oid(name), name, size, {}, mtime, etag=etag)
        removed = [o for o in self._add_locked(q) if o is not q]  # q itself: too big
        if self._objects.get(q.oid) is q:
            self._quarantine[name] = self.index.pin([q.oid])
        return removed

    def _adopt(self, obj: StoredObject) -> None:
        self._objects[obj.oid] = obj
        for key in obj.members:
            held = self._keys.get(key)
            if held is None or self.index.get(held.oid) is not held:
                self._keys[key] = obj

    def _removed(self, oids: list[bytes]) -> None:
        """The index let objects go (evicted, removed): their blocks leave too."""
        gone: list[BlockKey] = []
        with self._lock:
            for oid in oids:
                obj = self._objects.pop(oid, None)
                if obj is None:
                    continue
                if oid.startswith(QUARANTINE_TAG):
                    pins = self._quarantine.pop(obj.name, None)
                    if pins is not None:
                        pins.release()
                for key in obj.members:
                    if self._keys.get(key) is obj:
                        del self._keys[key]
                        gone.append(key)
        if gone:
            self._events.removed(gone)
