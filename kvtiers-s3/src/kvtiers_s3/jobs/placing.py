"""Records into slots: parse each record a load read (key, namespace, length), copy
its block into the job's slot and verify the slot against the record's checksum.

`Placer` works on the thread it is called from - a copier thread for bytes already
read (`place_all`), the request's own thread for a streamed body (`place_stream`,
straight into the slots: no intermediate copy) - and touches nothing but the slots
and the error log, so it is safe off the loop. The caller settles the outcomes on
the loop.

An outcome is None (placed and verified), `CORRUPT` (ours and broken: the caller
drops it from the index and deletes the object) or a `codec.Reason` - `foreign`,
`namespace`, `version`: a block object under our name that is not provably ours
(no kvtiers-s3 magic and no checksum that proves it ours once the magic is put back,
`layout.proof`; another namespace's or format's record), a miss to the job
(`MISSING`) that the caller remembers and quarantines, never deletes. A record of a
packed segment is always provably ours - the segment's index, checksummed and of
our namespace, says what it must be - so any record that is not it is `CORRUPT`.
"""

from __future__ import annotations

from typing import Any

from kvtiers.sdk import ErrorCounts, FailureReason, Job, TierContext, verify

from kvtiers_s3.holdings.catalog import BROKEN
from kvtiers_s3.holdings.index import StoredObject
from kvtiers_s3.jobs.ranges import Read
from kvtiers_s3.layout import codec, proof
from kvtiers_s3.layout.codec import FormatError, Reason

__all__ = ["Placed", "Placer"]

# What placing one record gives: None (in its slot, verified) or why not (a
# `Reason` for a block object not provably ours). An async job's items await
# instead of deferring, so no `Deferred` here.
Placed = FailureReason | Reason | None


class Placer:
    def __init__(self, ctx: TierContext, errors: ErrorCounts):
        self.pool = ctx.pool
        self.fingerprint = ctx.namespace.fingerprint
        self.block_bytes = ctx.block_bytes
        self.errors = errors

    def place_stream(self, job: Job, obj: StoredObject, read: Read, body: Any) -> list[Placed]:
        """Read the records of `read` from `body` (a file-like object at `read.start`)
        in order, each block straight into its slot, each slot verified."""
        out: list[Placed] = []
        pos = 0
        for i, rel, length in read.members:
            if rel > pos and len(read_exact(body, rel - pos)) < rel - pos:
                out.append(self.bad(obj, Reason.CORRUPT, "the object ended early"))
                pos = rel
                continue
            out.append(self._place_from(job, i, obj, body, length))
            pos = rel + length
        return out

    def _place_from(self, job: Job, i: int, obj: StoredObject, body: Any,
                    length: int) -> Placed:
        key = job.keys[i]
        head_len = codec.header_bytes(len(key))
        head = read_exact(body, head_len)
        try:
            header = codec.decode_header(head, self.fingerprint)
        except FormatError as exc:
            read_exact(body, length - len(head))  # keep the stream at the next record
            return self.bad(obj, *self._why(obj, key, head, exc))
        if header.key != key or header.payload_bytes != self.block_bytes \
                or header.record_bytes != length:
            read_exact(body, length - len(head))
            return self.bad(obj, Reason.CORRUPT, "the record is not this block's")
        member = obj.members.get(key)
        if member is not None and member.checksum is not None \
                and member.checksum != header.checksum:
            read_exact(body, length - len(head))
            return self.bad(obj, Reason.CORRUPT, "the record does not match the segment index")
        slot = self.pool.block(job.slots[i])
        if readinto_exact(body, slot) < len(slot):
            return self.bad(obj, Reason.CORRUPT, "truncated: the object ended inside the block")
        if not verify(slot, header.checksum):
            return self.bad(obj, Reason.CORRUPT, "block checksum mismatch")
        return None

    def place_all(self, job: Job, obj: StoredObject, read: Read,
                  data: bytes) -> list[Placed]:
        """The records of `read` from `data` (the bytes from `read.start`)."""
        view = memoryview(data)
        return [self._place(job, i, obj, view[rel:rel + length])
                for i, rel, length in read.members]

    def _place(self, job: Job, i: int, obj: StoredObject, record: memoryview) -> Placed:
        key = job.keys[i]
        member = obj.members.get(key)
        try:
            header, payload = codec.decode_record(record, self.fingerprint, key=key,
                                                  payload_bytes=self.block_bytes, verify=False)
        except FormatError as exc:
            return self.bad(obj, *self._why(obj, key, record[:codec.header_bytes(len(key))],
                                            exc))
        if member is not None and member.checksum is not None \
                and member.checksum != header.checksum:
            return self.bad(obj, Reason.CORRUPT, "the record does not match the segment index")
        slot = self.pool.block(job.slots[i])
        slot[:] = payload
        if not verify(slot, header.checksum):
            return self.bad(obj, Reason.CORRUPT, "block checksum mismatch")
        return None

    def _why(self, obj: StoredObject, key: bytes, head: bytes | memoryview,
             exc: FormatError) -> tuple[Reason, str]:
        """Why a record did not parse; a block object whose magic alone is damaged is
        ours and broken (`layout.proof`), not someone else's."""
        if exc.reason is Reason.FOREIGN and not obj.packed \
                and proof.record_is_ours(head, self.fingerprint, key):
            return Reason.CORRUPT, "its magic is damaged (its header checksum proves it ours)"
        return exc.reason, str(exc)

    def bad(self, obj: StoredObject, reason: Reason, why: str) -> Placed:
        """Count and log a record that is not the block (any thread)."""
        if obj.packed or reason in BROKEN:
            self.errors.note("load", "corrupt", f"{obj.name}: {why}; removed")
            return FailureReason.CORRUPT
        self.errors.note("load", "foreign", f"{obj.name}: {why}; not read again until it "
                                            "changes, never deleted, counted as used")
        return reason


def read_exact(body: Any, n: int) -> bytes:
    """Up to `n` bytes (fewer only at the end of the body)."""
    parts, left = [], n
    while left > 0:
        chunk = body.read(left)
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def readinto_exact(body: Any, dest: memoryview) -> int:
    """Fill `dest` from `body`; the bytes read (fewer only at the end of the body)."""
    view = memoryview(dest).cast("B")
    got = 0
    while got < len(view):
        n = body.readinto(view[got:])
        if not n:
            break
        got += n
    return got
