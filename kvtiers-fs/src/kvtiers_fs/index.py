"""`BlockIndex`: what one process knows of a namespace's blocks - committed blocks
(with their file sizes, least recently used first), the eviction policy over them,
intents in flight (pending), each writer's last removals, and usage.

Two kinds of caller, and what each may do:

- **any thread, the scheduler's included** - `contains`, `pin`, `unpin`, `touch`,
  `usage`, `blocks`, `reserved`: O(1) per key and lock-free. Reads are single
  dictionary operations (atomic in CPython); pins, unpins and touches are queued
  (a deque append) and applied by the owner later. So the scheduler never waits
  for the owner, however long the owner's work (a journal tail of a million
  records, a snapshot of a million blocks).
- **the owner** - the thread holding the store's journal mutex - everything else:
  it folds journal records in (`apply`), evicts, replaces the whole index
  (`install`), iterates it (`entries`, `pending_items`). It applies the queued
  operations first (`drain`), so an eviction always sees every pin queued before it.

Committed blocks live in `sizes` (a dict: ident -> file bytes, least recently
used first - a use takes the entry out and puts it back at the end; it answers
`contains`, gives sizes, and is the order written to snapshots; a lookup that
falls between the two halves of a use answers a harmless MISS) and in the policy
(which chooses victims). Pins are counted here (the policy's `pin` is a flag): a
block stays pinned while any load holds it.

Removals of committed blocks (evicted, dropped, removed by another process) are
collected for `take_removed`, so that the store can report them.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import cast

from kvtiers.policies.base import EvictionPolicy

from kvtiers_fs import journal as jr
from kvtiers_fs.journal import Record
from kvtiers_fs.layout import Ident
from kvtiers_fs.pacing import CHUNK, chunks, pause

_PIN, _UNPIN, _TOUCH = 0, 1, 2
#: touches remembered for the journal between flushes (older ones are dropped)
MAX_BUFFERED_TOUCHES = 1 << 16
#: touches queued for the owner at most (more are dropped until it drains)
MAX_QUEUED_OPS = 1 << 18


class BlockIndex:
    def __init__(self, policy_factory: Callable[[], EvictionPolicy]):
        self._policy_factory = policy_factory
        self.policy: EvictionPolicy = policy_factory()
        # A plain dict keeps insertion order; a use moves a block to the end by
        # taking it out and back in (half the memory of an OrderedDict).
        self.sizes: dict[Ident, int] = {}
        self.pending: dict[Ident, tuple[int, int]] = {}  # ident -> (writer, file bytes)
        self.last_deletes: dict[int, list[Ident]] = {}
        self.usage = 0  # committed + pending bytes, every writer's
        self._ops: deque[tuple[int, Ident]] = deque()
        self._pins: dict[Ident, int] = {}
        self._touched: OrderedDict[Ident, None] = OrderedDict()  # for the journal
        self._removed: list[Ident] = []
        self._sizes_cache: dict[int, int] = {}  # one int object per distinct size

    # -- any thread: lock-free, O(1) per key ------------------------------------

    def contains(self, idn: Ident) -> bool:
        return idn in self.sizes

    def pin(self, idns: Iterable[Ident]) -> None:
        self._ops.extend((_PIN, i) for i in idns)

    def unpin(self, idns: Iterable[Ident]) -> None:
        self._ops.extend((_UNPIN, i) for i in idns)

    def touch(self, idns: Iterable[Ident]) -> None:
        """Queued; dropped when the queue is full (recency is best effort; pins
        and unpins are never dropped)."""
        if len(self._ops) < MAX_QUEUED_OPS:
            self._ops.extend((_TOUCH, i) for i in idns)

    @property
    def blocks(self) -> int:
        return len(self.sizes)

    @property
    def reserved(self) -> int:
        return len(self.pending)

    def queued(self) -> int:
        """Operations waiting for `drain`."""
        return len(self._ops)

    # -- the owner ----------------------------------------------------------------

    def drain(self) -> None:
        """Apply the queued pins, unpins and touches (O(queued))."""
        ops, pins, policy, sizes = self._ops, self._pins, self.policy, self.sizes
        touched = self._touched
        n = len(ops)  # only what is there now: the queue may grow meanwhile
        for _ in range(n):
            op, idn = ops.popleft()
            if op == _PIN:
                count = pins.get(idn, 0)
                pins[idn] = count + 1
                if count == 0 and idn in sizes:
                    policy.pin(idn)
            elif op == _UNPIN:
                count = pins.get(idn, 0) - 1
                if count > 0:
                    pins[idn] = count
                    continue
                pins.pop(idn, None)
                if idn in sizes:
                    policy.unpin(idn)
            elif idn in sizes:
                policy.touch(idn)
                sizes[idn] = sizes.pop(idn)
                touched[idn] = None
                touched.move_to_end(idn)
        while len(touched) > MAX_BUFFERED_TOUCHES:
            touched.popitem(last=False)

    def take_touched(self) -> list[Ident]:
        """Touches to append to the journal (of blocks still held)."""
        out = [i for i in self._touched if i in self.sizes]
        self._touched.clear()
        return out

    def take_removed(self) -> list[Ident]:
        out, self._removed = self._removed, []
        return out

    def size_of(self, idn: Ident) -> int | None:
        return self.sizes.get(idn)

    def _size(self, size: int) -> int:
        return self._sizes_cache.setdefault(size, size)

    def _insert(self, idn: Ident, size: int) -> None:
        size = self._size(size)
        self.sizes[idn] = size
        self.policy.insert(idn, size)
        if idn in self._pins:
            self.policy.pin(idn)

    def evict_one(self) -> tuple[Ident, int] | None:
        """Take the policy's best unpinned victim out of the index (usage included);
        None when nothing is evictable."""
        while True:
            got = self.policy.evict_items(1)
            if not got:
                return None
            idn = cast(Ident, got[0][0])
            size = self.sizes.pop(idn, None)
            if size is None:
                continue  # the policy held a stale entry: drop it
            self.usage -= size
            return idn, size

    def put_back(self, victims: Iterable[tuple[Ident, int]]) -> None:
        """Undo `evict_one` (the eviction could not be journaled)."""
        for idn, size in victims:
            if idn not in self.sizes:
                self._insert(idn, size)
                self.usage += size

    def removed_by_us(self, idns: Iterable[Ident]) -> None:
        """Victims of `evict_one` whose removal is in the journal now: report them."""
        self._removed.extend(idns)

    def add_own(self, writer: int, items: Iterable[tuple[Ident, int]]) -> None:
        """Own intents just appended (their usage is in `usage` already)."""
        for idn, size in items:
            self.pending[idn] = (writer, size)

    def set_last_deletes(self, writer: int, dels: list[Ident]) -> None:
        # A writer's next frame proves it finished unlinking the previous one's.
        if dels:
            self.last_deletes[writer] = dels
        else:
            self.last_deletes.pop(writer, None)

    def apply(self, records: list[Record]) -> tuple[int, int] | None:
        """Fold one frame in. Returns (op, gen) for ROTATE/RELOAD, which end a
        journal (the rest of the frame is not applied)."""
        dels: list[Ident] = []
        sizes, pending = self.sizes, self.pending
        for n, r in enumerate(records, 1):
            if n % CHUNK == 0:
                pause()  # a large frame: see pacing.py
            op, idn = r.op, r.ident
            if op == jr.ADD:
                if idn not in pending and idn not in sizes:
                    pending[idn] = (r.writer, r.size)
                    self.usage += r.size
            elif op == jr.COMMIT:
                p = pending.get(idn)
                if p is not None:
                    if p[0] != r.writer:
                        continue  # another writer's intent: not this record's to end
                    del pending[idn]
                    if idn in sizes:
                        self.usage -= p[1]
                    else:
                        self._insert(idn, p[1])
                elif idn not in sizes and r.size:
                    # An intent a rebuild dropped while its writer was still writing:
                    # the writer vouches for the file it committed.
                    self._insert(idn, r.size)
                    self.usage += r.size
            elif op == jr.ABORT:
                p = pending.get(idn)
                if p is not None and p[0] == r.writer:
                    del pending[idn]
                    self.usage -= p[1]
            elif op in (jr.REMOVE, jr.FORGET):
                size = sizes.pop(idn, None)
                if size is not None:
                    self.usage -= size
                    self.policy.remove(idn)
                    self._removed.append(idn)
                if op == jr.REMOVE:
                    dels.append(idn)
            elif op == jr.TOUCH:
                if idn in sizes:
                    self.policy.touch(idn)
                    sizes[idn] = sizes.pop(idn)
            elif op == jr.GONE:
                self.last_deletes.pop(r.size, None)
            elif op in (jr.ROTATE, jr.RELOAD):
                return op, r.size
        if records:
            self.set_last_deletes(records[0].writer, dels)
        return None

    def install(self, records: Iterable[tuple[int, int, int, int, bytes]], *,
                report: bool) -> None:
        """Replace the whole index by a snapshot's records (`journal.raw_records`),
        built aside in pieces and swapped in; pins carry over. With `report`, blocks
        that the new index lacks count as removed."""
        policy = self._policy_factory()
        sizes: dict[Ident, int] = {}
        pending: dict[Ident, tuple[int, int]] = {}
        lastdel: dict[int, list[Ident]] = {}
        usage = 0
        entry, add, lastdel_op = jr.ENTRY, jr.ADD, jr.LASTDEL
        insert, interned = policy.insert, self._sizes_cache
        it = iter(records)
        while piece := list(islice(it, CHUNK)):  # a million records at start-up: lean
            for op, length, writer, size, raw in piece:
                idn = raw[:length]
                if op == entry:
                    if idn not in sizes:
                        size = interned.setdefault(size, size)
                        sizes[idn] = size
                        insert(idn, size)
                        usage += size
                elif op == add:
                    if idn not in pending and idn not in sizes:
                        pending[idn] = (writer, size)
                        usage += size
                elif op == lastdel_op:
                    lastdel.setdefault(writer, []).append(idn)
            pause()
        self.drain()
        for idn in self._pins:
            if idn in sizes:
                policy.pin(idn)
        old = self.sizes
        self.policy, self.sizes, self.pending, self.last_deletes, self.usage = (
            policy, sizes, pending, lastdel, usage)
        if report and old:
            for gone in chunks(old):
                self._removed.extend(i for i in gone if i not in sizes)

    def entries(self) -> Iterator[list[tuple[Ident, int]]]:
        """Committed blocks, least recently used first, in pieces (with pauses in
        between). The owner must not change the index until it has read them all."""
        return chunks(self.sizes.items())

    def pending_items(self) -> list[tuple[Ident, tuple[int, int]]]:
        return list(self.pending.items())

    def last_delete_items(self) -> list[tuple[int, Ident]]:
        return [(w, i) for w, ids in self.last_deletes.items() for i in ids]

    def writers_with_state(self) -> set[int]:
        """Writers that have intents or unfinished removals here."""
        return {w for w, _ in self.pending.values()} | set(self.last_deletes)

    def intents_of(self, writer: int) -> list[Ident]:
        return [i for i, (w, _) in self.pending.items() if w == writer]

    def committed_bytes(self) -> int:
        return self.usage - sum(s for _, s in self.pending.values())
