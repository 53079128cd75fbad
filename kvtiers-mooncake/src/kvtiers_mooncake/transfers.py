"""`Transfers`: the load and store hooks of one `mooncake` tier (`JobHooks` for the
core's `JobEngine`), one Mooncake batch call per unit of a job.

Stores: the start hook reserves room in the index (evicting by policy: the
evicted objects go to the `Housekeeper`, which removes them once their lease
allows); a unit computes its blocks' checksums from the slots, writes each
header into the slot's header area and puts every object with one
`batch_put_from_multi_buffers`; the end hook makes what was put visible to
`lookup`, in the job's order. A key whose old object is still being removed
waits (`REJECTED` now; stored by a later cascade): Mooncake keeps an existing
object on put, and the removal would take the new one.

Loads: what `lookup` called a HIT was pinned at submit (if it is ours; a block
another engine stored is found by the probe and loaded the same way). One
`batch_get_into_multi_buffers` places each header in the slot's area and each
block in its slot; the header must be this key's, of this namespace and size,
and the block's checksum is taken from the slot. An object that is not
provably ours (another program's, another model's) is a miss, left alone; ours
and damaged (bad checksum, a broken header, cut short) fails `corrupt` and is
removed once its lease allows; a missing one (the master evicted it, its segment
went away, the master restarted) is a miss. Each leaves the index.

Every call passes the tier's `Breaker`: a master that does not answer, or a
transfer that fails, opens it, and units fail `io` at once until a call succeeds
again, which starts a reconciliation of the index (`Housekeeper.reconcile`).

Threads: the engine's I/O threads; nothing here runs on the scheduler thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvtiers.sdk import (
    BoundedIndex,
    ErrorCounts,
    FailureReason,
    Job,
    JobHooks,
    Outcome,
    Reservation,
    StatsRecorder,
    TierContext,
    checksum,
    checksum_slots,
    end_pinned_load,
    reserve_store,
)

from kvtiers_mooncake import record
from kvtiers_mooncake.client import (
    EXISTS,
    NO_SPACE,
    NOT_FOUND,
    NOT_READY,
    RPC_FAIL,
    TENANT_QUOTA,
    TENANT_UNKNOWN,
    BreakerOpen,
    StoreClient,
    failure_of,
)
from kvtiers_mooncake.housekeeping import Housekeeper
from kvtiers_mooncake.names import Names

__all__ = ["Transfers", "slot_sums"]

#: put codes that are the store's answer, not its trouble
_ANSWERS = frozenset((EXISTS, NO_SPACE, TENANT_QUOTA, TENANT_UNKNOWN))
#: a header's bytes besides its key's (`record.header_bytes(k) == _HEADER_BARE + k`)
_HEADER_BARE = record.header_bytes(0)


@dataclass(slots=True)
class _Stored:
    room: Reservation[None]
    written: set[int] = field(default_factory=set)
    names: list[str] = field(default_factory=list)  # each key's object name


def slot_sums(ctx: TierContext, slots: Sequence[int],
              errors: ErrorCounts) -> list[int | None]:
    """The checksum of each slot's block; None for a slot the pool cannot give
    (its key fails alone). One native call for the whole unit when it can."""
    try:
        return list(checksum_slots(ctx.pool, slots))
    except (OSError, IndexError):
        out: list[int | None] = []
        for slot in slots:
            try:
                out.append(checksum(ctx.pool.block(slot)))
            except (OSError, IndexError) as exc:
                errors.record("slot", exc)
                out.append(None)
        return out


class Transfers:
    def __init__(self, ctx: TierContext, client: StoreClient, index: BoundedIndex[None],
                 names: Names, stats: StatsRecorder, errors: ErrorCounts,
                 house: Housekeeper, on_recovery: Callable[[], None]):
        self.ctx = ctx
        self.client = client
        self.index = index
        self.names = names
        self.stats = stats
        self.errors = errors
        self.house = house
        self.on_recovery = on_recovery
        self.fingerprint = ctx.namespace.fingerprint
        self.block_bytes = ctx.block_bytes
        self.expected = record.FORMAT.packer(self.fingerprint, ctx.block_bytes)
        self.load = JobHooks(block=self._load_one, batch=self._load_many, end=self._end_load)
        self.store = JobHooks(block=self._store_one, batch=self._store_many,
                              start=self._reserve, end=self._end_store)

    # The breaker's bookkeeping around one call.

    def _outcome_of_call(self, failed: bool) -> None:
        if failed:
            self.client.breaker.failed()
        elif self.client.breaker.succeeded():
            self.on_recovery()

    def _refused(self, job: Job, op: str, exc: BaseException) -> FailureReason:
        if job.expired():
            return FailureReason.TIMEOUT
        if isinstance(exc, BreakerOpen):
            return FailureReason.IO
        self.client.breaker.failed()
        self.errors.record(op, exc)
        return FailureReason.IO

    # Loads.

    def _load_one(self, job: Job, i: int) -> Outcome:
        return self._load_many(job, [i])[0]

    def _load_many(self, job: Job, indices: Sequence[int]) -> list[Outcome]:
        keys, bb, block_name = job.keys, self.block_bytes, self.names.block
        out: list[Outcome] = [FailureReason.MISSING] * len(indices)
        # A name being removed (found damaged, evicted) is gone already.
        names = [block_name(keys[i]) for i in indices]
        leaving, longest = self.house.among(names), record.MAX_KEY_BYTES
        todo: list[tuple[int, int, str]] = [  # (n, i, name)
            (n, i, name) for n, (i, name) in enumerate(zip(indices, names, strict=True))
            if len(keys[i]) <= longest and name not in leaving]
        if not todo:
            return out
        job_slots, bare = job.slots, _HEADER_BARE
        slots = [job_slots[i] for _, i, _ in todo]
        hlens = [bare + len(keys[i]) for _, i, _ in todo]
        try:
            codes = self.client.get([t[2] for t in todo], slots, hlens, bb)
        except Exception as exc:  # noqa: BLE001 - the store's trouble is a miss
            reason = self._refused(job, "load", exc)
            for n, _, _ in todo:
                out[n] = reason
            return out
        # Only the master's silence counts here: a failed transfer is judged below.
        self._outcome_of_call(RPC_FAIL in codes)
        # Whole objects: the block's checksum from the slot, then the header must be
        # the very bytes this key's header with that checksum has (one comparison).
        placed: list[tuple[int, int, str, int, int]] = []  # (n, i, name, slot, length)
        for (n, i, name), slot, hlen, code in zip(todo, slots, hlens, codes, strict=True):
            if code == hlen + bb:
                placed.append((n, i, name, slot, hlen))
            else:
                out[n] = self._unread(job, i, name, code, hlen + bb)
        if not placed:
            return out
        sums = slot_sums(self.ctx, [p[3] for p in placed], self.errors)
        area, at, pack = self.client.area, record.AREA_BYTES, self.expected.pack
        for (n, i, name, slot, hlen), found in zip(placed, sums, strict=True):
            if found is None:
                out[n] = FailureReason.IO
            elif area[slot * at:slot * at + hlen] == pack(keys[i], found):
                out[n] = None
            else:
                bad = record.judge(self.client.header_view(slot, hlen), self.fingerprint,
                                   keys[i], bb, hlen + bb)
                out[n] = self._bad(job, i, name, bad or record.Bad.BROKEN)
        return out

    def _bad(self, job: Job, i: int, name: str, bad: record.Bad) -> FailureReason:
        """An object at our name that is not the block: ours and damaged is removed
        (a `corrupt`); anyone else's is left alone (a miss). Either leaves the index."""
        key = job.keys[i]
        if bad is record.Bad.BROKEN:
            held = self.index.size_of(key) is not None  # ours, counted in usage
            self.index.remove(key)
            self.house.remove([name], self.block_bytes if held else 0, damaged=True)
            return FailureReason.CORRUPT
        self.errors.note("load", bad.value, f"an object at a block's name is {bad.value}: "
                                            "a miss, left alone")
        self.index.remove(key)
        return FailureReason.MISSING

    def _unread(self, job: Job, i: int, name: str, code: int, expected: int) -> FailureReason:
        """A get that did not return the object whole: gone, of another size (whose
        is it?), or the store's trouble."""
        if code == NOT_FOUND:
            self.index.remove(job.keys[i])
            return FailureReason.MISSING
        if code == NOT_READY:  # another engine's put of it is under way
            return FailureReason.MISSING
        if code == RPC_FAIL:
            self.errors.note("load", failure_of(code), f"load: {failure_of(code)}")
            return FailureReason.TIMEOUT if job.expired() else FailureReason.IO
        try:
            size = self.client.size(name)
            if size == NOT_FOUND:
                self.index.remove(job.keys[i])
                return FailureReason.MISSING
            if size == expected or size < 0:  # the bytes did not move: a segment is away
                self.client.breaker.failed()
                self.errors.note("load", failure_of(code), f"load: {failure_of(code)}")
                return FailureReason.IO
            head = self.client.read(name, size) if size <= 4 * expected else b""
        except Exception as exc:  # noqa: BLE001
            return self._refused(job, "load", exc)
        bad = record.judge(head[:record.AREA_BYTES], self.fingerprint, job.keys[i],
                           self.block_bytes, size)
        return self._bad(job, i, name, bad or record.Bad.BROKEN)

    def _end_load(self, job: Job) -> None:
        end_pinned_load(self.index, job)

    # Stores.

    def _reserve(self, job: Job) -> list[int]:
        reserved = reserve_store(self.index, job, self.block_bytes, plan=_Stored,
                                 stats=self.stats, delete=self._remove_evicted)
        plan: _Stored = job.state
        block_name, keys = self.names.block, job.keys
        plan.names = names = [block_name(k) for k in keys]
        leaving, longest = self.house.among(names), record.MAX_KEY_BYTES
        todo = []
        for i in reserved:
            key = keys[i]
            if len(key) > longest:
                self.errors.note("store", "key", f"a key of {len(key)} bytes is longer "
                                 f"than {longest}: not stored")
                job.fail(i, FailureReason.REJECTED)
            elif names[i] in leaving:
                job.fail(i, FailureReason.REJECTED)  # its old object is being removed
            else:
                todo.append(i)
        return todo

    def _remove_evicted(self, keys: list[bytes]) -> None:
        """Objects evicted for a store, removed on this thread: the room is there
        before its put."""
        self.house.remove_now([self.names.block(k) for k in keys], self.block_bytes)

    def _store_one(self, job: Job, i: int) -> Outcome:
        return self._store_many(job, [i])[0]

    def _store_many(self, job: Job, indices: Sequence[int]) -> list[Outcome]:
        plan: _Stored = job.state
        keys, bb, pack, all_names = job.keys, self.block_bytes, self.expected.pack, plan.names
        area, header_at = self.client.area_view, record.AREA_BYTES
        out: list[Outcome] = [FailureReason.IO] * len(indices)
        job_slots = job.slots
        slots = [job_slots[i] for i in indices]
        sums = slot_sums(self.ctx, slots, self.errors)
        todo: list[tuple[int, int, int, int]] = []  # (n, i, slot, header length)
        names: list[str] = []
        for n, (i, slot, found) in enumerate(zip(indices, slots, sums, strict=True)):
            if found is None:
                continue
            head = pack(keys[i], found)
            start = slot * header_at
            area[start:start + len(head)] = head
            todo.append((n, i, slot, len(head)))
            names.append(all_names[i])
        if not todo:
            return out
        try:
            codes = self.client.put(names, [t[2] for t in todo], [t[3] for t in todo], bb)
        except Exception as exc:  # noqa: BLE001 - the store's trouble is a failed copy
            reason = self._refused(job, "store", exc)
            return [reason] * len(indices)
        if codes.count(0) == len(codes):  # (the usual answer: every object put)
            self._outcome_of_call(False)
            plan.written.update([t[1] for t in todo])
            for t in todo:
                out[t[0]] = None
            return out
        # Room and tenant refusals are answers: only other failures open the breaker.
        self._outcome_of_call(any(c < 0 and c not in _ANSWERS for c in codes))
        for (n, i, _, _), code in zip(todo, codes, strict=True):
            if code in (0, EXISTS):
                plan.written.add(i)
                out[n] = None
            elif code in (NO_SPACE, TENANT_QUOTA):
                out[n] = FailureReason.FULL
            elif code == TENANT_UNKNOWN:
                self.errors.note("store", failure_of(code),
                                 f"store: the master refuses tenant "
                                 f"{self.client.settings.tenant!r} ({failure_of(code)}): "
                                 "add it to the master's tenant quota policy")
                out[n] = FailureReason.REJECTED
            else:
                self.errors.note("store", failure_of(code), f"store: {failure_of(code)}")
                out[n] = FailureReason.TIMEOUT if job.expired() else FailureReason.IO
        return out

    def _end_store(self, job: Job) -> None:
        """What was put becomes visible to lookup (only now: a HIT is always readable)."""
        plan: _Stored | None = job.state
        if plan is None:  # never started: timeout or closed
            return
        with plan.room as room:
            written = {job.keys[i] for i in plan.written}
            done = [k for k in job.succeeded_keys() if k in written]  # in the job's order
            room.commit_many(done, [None] * len(done), close=True)
