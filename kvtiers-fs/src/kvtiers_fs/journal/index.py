"""`BlockIndex`: what one process knows of a namespace's blocks - the journal's fold.

Committed blocks, their sizes, the eviction policy, pin reference counts and the
capacity bound live in the core's `kvtiers.sdk.BoundedIndex` (`bounded`, queued
mode: key = the block's ident, location = its file's size); this class adds what
the shared journal needs on top: intents in flight (`pending`: ident -> writer and
bytes, every writer's; their bytes are `hold`s of the bounded index), each writer's
last removals (to redo if it died), touches to append to the journal, and the
removals to report.

Two kinds of caller, and what each may do:

- **any thread, the scheduler's included** - `contains`, `pin` (and the `Pins`
  release), `touch`, `usage`, `blocks`, `reserved`: O(1) per key and lock-free
  (`BoundedIndex`'s queued mode: pins and touches are queued and applied before any
  eviction). So the scheduler never waits for the owner, however long the owner's
  work (a journal tail of a million records, a snapshot of a million blocks).
- **the owner** - the thread holding the store's journal mutex - everything else:
  it folds journal records in (`apply`), makes room (`make_room`), replaces the
  index (`install`), lists it (`entries`, `pending_items`).

Removals of committed blocks (evicted, dropped, removed by another process) are
collected for `take_removed` (the bounded index reports them here), so that the
store reports them as keys.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Generator, Iterable
from contextlib import closing
from itertools import islice

from kvtiers.sdk import BoundedIndex, EvictionPolicy, Pins

from kvtiers_fs.disk.layout import Ident
from kvtiers_fs.journal import records as jr
from kvtiers_fs.journal.records import Record
from kvtiers_fs.pacing import CHUNK, chunks, pause

#: touches remembered for the journal between flushes (older ones are dropped)
MAX_BUFFERED_TOUCHES = 1 << 16
#: touches queued for the journal at most (more are dropped until the owner drains)
MAX_QUEUED_TOUCHES = 1 << 18


class BlockIndex:
    def __init__(self, policy: EvictionPolicy, capacity_bytes: int):
        self._removed: list[Ident] = []
        #: committed blocks: ident -> file size (as location and size), pins, policy
        self.bounded: BoundedIndex[int] = BoundedIndex(
            policy, capacity_bytes, on_removed=self._removed.extend, queued=True)
        self.pending: dict[Ident, tuple[int, int]] = {}  # ident -> (writer, file bytes)
        self.last_deletes: dict[int, list[Ident]] = {}
        self._touch_log: deque[list[Ident]] = deque()  # scheduler -> owner, for the journal
        self._touch_logged = 0
        self._touched: OrderedDict[Ident, None] = OrderedDict()
        self._sizes_cache: dict[int, int] = {}  # one int object per distinct size

    # -- any thread: lock-free, O(1) per key ------------------------------------

    def contains(self, idn: Ident) -> bool:
        return idn in self.bounded

    def pin(self, idns: list[Ident]) -> Pins[int]:
        """Pin the blocks held now until the result is released (`Pins.release`)."""
        return self.bounded.pin(idns)

    def touch(self, idns: Iterable[Ident]) -> None:
        """Recency now (queued in the bounded index) and, later, in the journal.
        Dropped when the journal's queue is full (recency is best effort)."""
        idns = list(idns)
        self.bounded.touch(idns)
        if self._touch_logged < MAX_QUEUED_TOUCHES:
            self._touch_log.append(idns)
            self._touch_logged += len(idns)

    @property
    def blocks(self) -> int:
        return len(self.bounded)

    @property
    def reserved(self) -> int:
        return len(self.pending)

    @property
    def usage(self) -> int:
        """Committed plus pending bytes, every writer's."""
        return self.bounded.committed_bytes + self.bounded.reserved_bytes

    def queued(self) -> int:
        """Operations waiting for `drain`."""
        return self.bounded.queued + len(self._touch_log)

    # -- the owner ----------------------------------------------------------------

    def drain(self) -> None:
        """Apply the queued pins, releases and touches (O(queued))."""
        self.bounded.apply_queued()
        log, touched = self._touch_log, self._touched
        for _ in range(len(log)):  # only what is there now: the queue may grow meanwhile
            idns = log.popleft()
            self._touch_logged -= len(idns)
            for idn in idns:
                touched[idn] = None
                touched.move_to_end(idn)
        while len(touched) > MAX_BUFFERED_TOUCHES:
            touched.popitem(last=False)

    def take_touched(self) -> list[Ident]:
        """Touches to append to the journal (of blocks still held)."""
        out = [i for i in self._touched if i in self.bounded]
        self._touched.clear()
        return out

    def take_removed(self) -> list[Ident]:
        out = self._removed[:]
        del self._removed[:]  # the bounded index appends to this very list
        return out

    def size_of(self, idn: Ident) -> int | None:
        return self.bounded.size_of(idn)

    def _size(self, size: int) -> int:
        return self._sizes_cache.setdefault(size, size)

    def make_room(self, size: int) -> list[tuple[Ident, int]] | None:
        """Count `size` bytes for an own intent, evicting unpinned blocks by policy to
        make room: the victims (out of the index, usage included; removals collected),
        or None when it cannot fit (nothing changed)."""
        return self.bounded.hold(self._size(size))

    def put_back(self, victims: list[tuple[Ident, int]], held: int) -> None:
        """Undo `make_room` calls (the frame could not be journaled): the victims back
        in, as the newest, not reported as removed; `held` bytes given back."""
        self.bounded.adopt((i, s, s) for i, s in victims)
        self.bounded.release(held)
        back = {i for i, _ in victims}
        self._removed[:] = [i for i in self._removed if i not in back]

    def add_own(self, writer: int, items: Iterable[tuple[Ident, int]]) -> None:
        """Own intents just appended (their bytes are held already: `make_room`)."""
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
        journal (the rest of the frame is not applied).

        Commits and the held bytes of intents are gathered per piece of `CHUNK`
        records and handed to the bounded index at once (one lock hold per piece,
        not per record: a journal tail of a million records); a record that depends
        on a gathered commit (a removal or touch of that block) hands them over first.
        Only the owner changes the index, so nobody sees the difference but usage,
        which lags by at most one piece."""
        dels: list[Ident] = []
        bounded, pending = self.bounded, self.pending
        adopted: dict[Ident, int] = {}  # committed by this piece, not adopted yet
        held = 0  # bytes of intents begun minus ended by this piece, not counted yet
        for n, r in enumerate(records, 1):
            if n % CHUNK == 0:
                held = self._hand_over(adopted, held)
                pause()  # a large frame: see pacing.py
            op, idn = r.op, r.ident
            if op == jr.ADD:
                if idn not in pending and idn not in bounded and idn not in adopted:
                    pending[idn] = (r.writer, r.size)
                    held += r.size  # its writer made room
            elif op == jr.COMMIT:
                p = pending.get(idn)
                if p is not None:
                    if p[0] != r.writer:
                        continue  # another writer's intent: not this record's to end
                    del pending[idn]
                    held -= p[1]
                    # (kept as it is if it is held already: `adopt`)
                    adopted.setdefault(idn, self._size(p[1]))
                elif idn not in bounded and idn not in adopted and r.size:
                    # An intent a rebuild dropped while its writer was still writing:
                    # the writer vouches for the file it committed.
                    adopted[idn] = self._size(r.size)
            elif op == jr.ABORT:
                p = pending.get(idn)
                if p is not None and p[0] == r.writer:
                    del pending[idn]
                    held -= p[1]
            elif op in (jr.REMOVE, jr.FORGET):
                if idn in adopted:
                    held = self._hand_over(adopted, held)
                bounded.remove(idn)  # reported to `_removed` when it was held
                if op == jr.REMOVE:
                    dels.append(idn)
            elif op == jr.TOUCH:
                if idn in adopted:
                    held = self._hand_over(adopted, held)
                bounded.touch((idn,))
            elif op == jr.GONE:
                self.last_deletes.pop(r.size, None)
            elif op in (jr.ROTATE, jr.RELOAD):
                self._hand_over(adopted, held)
                return op, r.size
        self._hand_over(adopted, held)
        if records:
            self.set_last_deletes(records[0].writer, dels)
        return None

    def _hand_over(self, adopted: dict[Ident, int], held: int) -> int:
        """Give the bounded index what `apply` gathered; returns 0 (nothing left)."""
        bounded = self.bounded
        if adopted:
            bounded.adopt((i, s, s) for i, s in adopted.items())
            adopted.clear()
        if held > 0:
            bounded.hold(held, evict=False)
        elif held < 0:
            bounded.release(-held)
        return 0

    def install(self, records: Iterable[tuple[int, int, int, int, bytes]], *,
                report: bool) -> None:
        """Make the index a snapshot's records (`records.raw_records`): read in pieces,
        then blocks the snapshot lacks removed, its new ones adopted in its order
        (oldest first), blocks in both kept as they are - pins included. With
        `report`, the blocks removed count as removed."""
        bounded = self.bounded
        # Start-up (nothing held yet): entries go straight in, piece by piece.
        # Otherwise the snapshot is read aside first, to tell what went.
        sizes: dict[Ident, int] | None = {} if len(bounded) else None
        pending: dict[Ident, tuple[int, int]] = {}
        lastdel: dict[int, list[Ident]] = {}
        entry, add, lastdel_op = jr.ENTRY, jr.ADD, jr.LASTDEL
        interned = self._sizes_cache
        it = iter(records)
        while piece := list(islice(it, CHUNK)):  # a million records at start-up: lean
            adopted: list[tuple[Ident, int, int]] = []
            for op, length, writer, size, raw in piece:
                idn = raw[:length]
                if op == entry:
                    size = interned.setdefault(size, size)
                    adopted.append((idn, size, size))
                elif op == add:
                    if idn not in pending:
                        pending[idn] = (writer, size)
                elif op == lastdel_op:
                    lastdel.setdefault(writer, []).append(idn)
            if sizes is None:
                bounded.adopt(adopted)
            else:
                sizes.update((i, s) for i, _, s in adopted if i not in sizes)
            pause()
        if sizes is not None:
            before = len(self._removed)
            went: list[Ident] = []
            with closing(bounded.iter_items(CHUNK)) as pieces:  # its lock held meanwhile
                for had in pieces:
                    went += [i for i, _, _ in had if i not in sizes]
                    pause()
            for gone in chunks(went):
                for idn in gone:
                    bounded.remove(idn)
            if not report:
                del self._removed[before:]
            for kept in chunks(sizes.items()):
                bounded.adopt((i, s, s) for i, s in kept)
        for idn in [i for i in pending if i in bounded]:
            del pending[idn]  # committed in the snapshot: no intent
        bounded.release(sum(s for _, s in self.pending.values()))
        bounded.hold(sum(s for _, s in pending.values()), evict=False)
        self.pending, self.last_deletes = pending, lastdel

    def entries(self) -> Generator[list[tuple[Ident, int]], None, None]:
        """Committed blocks in order of use (least recently used first), in pieces
        (with pauses in between), read from the bounded index without copying it
        (`BoundedIndex.iter_items`: its lock is held until the last piece is read -
        the scheduler's pins and touches queue meanwhile). The owner must not call
        the index until it has read them all or closed the iterator (`closing`: an
        iterator left open keeps that lock)."""
        with closing(self.bounded.iter_items(CHUNK)) as pieces:
            for piece in pieces:
                yield [(i, s) for i, _, s in piece]
                pause()

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
        return self.bounded.committed_bytes
