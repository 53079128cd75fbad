"""`verify_namespace(...)`: the s3 tier's `verify_blocks` - every object the tier
holds read whole and re-checked (`kvtiers verify`).

A block object: its record parsed strictly (magic, version, namespace, key, length,
header checksum) and its bytes checksummed. A segment: its index parsed against
the object's length, then every record in it as a ranged load checks it (key,
length, checksum against the index) and its bytes checksummed. Reasons are the
shared vocabulary of `kvtiers.contract.verification`.

What is *ours* is decided as the tier's data path decides it (`holdings.catalog.BROKEN`,
and `layout.proof` for an object whose magic alone is damaged): a block record or a
segment index of our namespace with a broken field, a damaged magic that the
checksum covering it proves ours, any record of a segment whose index reads. With
`repair` such an object leaves the index (usage stays exact) and is deleted - a
damaged segment whole, its good blocks with it (an object is never rewritten in
place; they are counted in a note). An object that is not provably ours - no
kvtiers-s3 magic and no such proof (another program's object), another namespace's
or format version's record - is reported and never deleted, `repair` or not; so are
objects under the namespace's prefix at names the tier never makes (a note: never
read, counted or deleted by the tier).

Opening the tier already lists the prefix, as every engine's start-up does, and
deletes what is provably ours and broken from the listing alone (a block object
whose size is not a record's, a segment whose index does not read): those are
reported too, as removed when the tier opened, whatever `repair` says; and the
segments it found not provably ours (left alone, counted as used).

Beside live engines on a shared prefix: an object another engine evicted (deleted)
meanwhile is `vanished`, not bad; objects are never modified in place, so a read
sees one whole object. Runs on the tier's event loop, a piece of objects at a time,
with checksums on the copier threads; `progress` is called between pieces from the
caller's thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kvtiers.sdk import BadBlock, BlockKey, Progress, VerifyReport, checksum

from kvtiers_s3.client.objects import describe
from kvtiers_s3.holdings.catalog import BROKEN, Scan
from kvtiers_s3.holdings.index import StoredObject
from kvtiers_s3.jobs.iocontext import IoContext
from kvtiers_s3.layout import codec, proof, segment
from kvtiers_s3.layout.codec import FormatError, Reason
from kvtiers_s3.layout.names import BLOCKS, parse_name
from kvtiers_s3.tools.survey import unknown_names

__all__ = ["check_block", "check_segment", "verify_namespace"]

#: objects checked per round on the loop (progress is reported between rounds)
PIECE = 16
#: objects read at once (a segment is up to `layout.segment_bytes`)
READS = 4
#: unknown names shown in the note, at most
SHOWN = 3

#: a format problem, in `kvtiers.contract.verification`'s words
REASON = {
    Reason.TRUNCATED: "truncated", Reason.LENGTH: "truncated", Reason.CORRUPT: "header",
    Reason.FOREIGN: "header", Reason.VERSION: "foreign", Reason.NAMESPACE: "foreign",
    Reason.KEY: "foreign",
}
#: (reason, detail, provably ours) of one bad record or object
Finding = tuple[str, str, bool]


def _judged(exc: FormatError, ours: bool) -> Finding:
    if exc.reason is Reason.FOREIGN and not ours:
        return "header", ("no kvtiers-s3 magic, and no checksum proves it ours once the "
                          "magic is put back: another program's object, or ours damaged "
                          "past proof; not ours to delete, left alone"), False
    if exc.reason is Reason.FOREIGN:
        return "header", "its magic is damaged (its checksum proves it ours)", True
    return REASON[exc.reason], exc.detail + ("" if ours else "; not ours to delete, left "
                                              "alone"), ours


def check_block(data: bytes, key: BlockKey, fingerprint: str, block_bytes: int) -> Finding | None:
    """None when `data` is the block object of `key`, whole and unchanged; else what
    is wrong, and whether the object is provably ours (the data path's rule:
    `holdings.catalog.BROKEN`, or a damaged magic that `layout.proof` proves ours)."""
    try:
        header, payload = codec.decode_record(data, fingerprint, key=key,
                                              payload_bytes=block_bytes, verify=False)
    except FormatError as exc:
        ours = exc.reason in BROKEN or (
            exc.reason is Reason.FOREIGN
            and proof.record_is_ours(data[:codec.header_bytes(len(key))], fingerprint, key))
        return _judged(exc, ours)
    if checksum(payload) != header.checksum:
        return "checksum", "the block's bytes do not match its checksum", True
    return None


def _segment_is_ours(data: bytes, fingerprint: str) -> bool:
    try:
        return proof.segment_index_is_ours(data, fingerprint)
    except FormatError:  # the index claims more bytes than the object has
        return False


def check_segment(data: bytes, fingerprint: str, block_bytes: int
                  ) -> tuple[Finding | None, list[tuple[BlockKey, str, str]], int]:
    """(what is wrong with the segment's index - None if it reads - with whether
    the segment is provably ours, as for `check_block`; each bad record as (key,
    reason, detail): a segment whose index reads is ours, so is every record in it;
    how many records it holds)."""
    try:
        index = segment.decode_index(data, fingerprint, object_bytes=len(data))
    except FormatError as exc:
        ours = exc.reason in BROKEN or (
            exc.reason is Reason.FOREIGN and _segment_is_ours(data, fingerprint))
        reason, detail, ours = _judged(exc, ours)
        return (reason, "segment index: " + detail, ours), [], 0
    bad: list[tuple[BlockKey, str, str]] = []
    view = memoryview(data)
    for e in index.entries:
        try:
            header, payload = segment.decode_member(view[e.offset:e.end], e, fingerprint,
                                                    payload_bytes=block_bytes, verify=False)
        except FormatError as exc:
            bad.append((e.key, REASON[exc.reason], f"record at {e.offset}: {exc.detail}"))
            continue
        if checksum(payload) != header.checksum:
            bad.append((e.key, "checksum", f"record at {e.offset}: the block's bytes do not "
                                           "match its checksum"))
    return None, bad, len(index.entries)


@dataclass
class _Tally:
    bad: list[BadBlock] = field(default_factory=list)
    checked: int = 0
    vanished: int = 0
    removed_bytes: int = 0
    lost: int = 0  # good blocks deleted with their damaged segments
    foreign: int = 0  # bad, not provably ours: left alone


class _Verifier:
    """One run over the objects the tier holds (the loop's coroutines)."""

    def __init__(self, io: IoContext, repair: bool):
        self.io = io
        self.repair = repair
        self.tally = _Tally()
        self.where = f"{io.settings.protocol}://"
        self._reads = asyncio.Semaphore(READS)

    async def piece(self, objects: list[StoredObject]) -> None:
        await asyncio.gather(*(self.one(o) for o in objects))

    async def one(self, obj: StoredObject) -> None:
        io, tally = self.io, self.tally
        keys = list(obj.members)
        if not keys:
            return  # holds no block (a quarantined object): nothing to check
        location = self.where + obj.name
        try:
            async with self._reads:
                data = await asyncio.wait_for(io.store.get(obj.name), io.settings.timeout_s)
        except FileNotFoundError:  # another engine evicted it meanwhile: not bad
            tally.vanished += len(keys)
            io.holdings.drop(obj)
            return
        except Exception as exc:  # noqa: BLE001 - reported, the next object goes on
            tally.checked += len(keys)
            why = describe(exc, io.settings)
            tally.bad += [BadBlock(k, "unreadable", why, location) for k in keys]
            return
        tally.checked += len(keys)
        if not obj.packed:
            found = await io.off_loop(check_block, data, keys[0], io.fingerprint, io.block_bytes)
            if found is not None:
                reason, detail, ours = found
                removed = ours and await self.remove(obj)
                tally.foreign += not ours
                tally.bad.append(BadBlock(keys[0], reason, detail, location, removed))
            return
        whole, records, count = await io.off_loop(check_segment, data, io.fingerprint,
                                                  io.block_bytes)
        if whole is not None:
            reason, detail, ours = whole
            removed = ours and await self.remove(obj)
            tally.foreign += not ours
            tally.bad.append(BadBlock(None, reason, f"{detail} ({len(keys)} block(s) in it)",
                                      location, removed))
        elif records:
            removed = await self.remove(obj)
            if removed:
                tally.lost += count - len(records)
            tally.bad += [BadBlock(k, reason, detail, location, removed)
                          for k, reason, detail in records]

    async def remove(self, obj: StoredObject) -> bool:
        """With `repair`: `obj` leaves the index, then the store (the tier's own
        background delete, awaited). True once it is gone."""
        if not self.repair:
            return False
        io = self.io
        io.holdings.drop(obj)
        io.delete_names([obj.name])  # no listing or probe takes it back in meanwhile
        await io.deleted(obj.name)
        if await io.store.info(obj.name) is not None:
            return False  # the delete failed (counted in the tier's errors)
        self.tally.removed_bytes += obj.size
        return True

    async def at_opening(self, startup: Scan | None) -> list[BadBlock]:
        """What the tier's start-up listing found: broken objects of ours it deleted
        (asked again now: removed when gone), and others' segments it left."""
        if startup is None:
            return []
        io = self.io
        out = []
        for name in startup.bad:
            parsed = parse_name(io.ns_root, name)
            await io.deleted(name)  # the start-up's delete, in the background
            gone = await io.store.info(name) is None
            if parsed is not None and parsed.kind == BLOCKS and parsed.key is not None:
                out.append(BadBlock(parsed.key, "truncated", "its size is not a block "
                                    "record's; deleted when the tier opened (every engine's "
                                    "start-up deletes what is its own and broken)",
                                    self.where + name, gone))
            else:
                out.append(BadBlock(None, "header", "a segment whose index does not read "
                                    "(damaged, or not a kvtiers-s3 segment at a name only "
                                    "kvtiers-s3 makes); deleted when the tier opened",
                                    self.where + name, gone))
        for info, reason in startup.others:
            what = {Reason.NAMESPACE: "a segment of another namespace",
                    Reason.VERSION: "a segment of another format version"}.get(
                reason, "no kvtiers-s3 magic, and no checksum proves it ours")
            out.append(BadBlock(None, "header" if reason is Reason.FOREIGN else "foreign",
                                f"{what}: not ours to delete, left alone (counted as used)",
                                self.where + info.name))
            self.tally.foreign += 1
        return out

    async def strangers(self) -> str | None:
        """A note on the objects under the namespace's prefix at names the tier
        never makes, if any."""
        io = self.io
        found = unknown_names(io.ns_root, await io.store.list_objects(io.ns_root + "/"))
        if not found:
            return None
        shown = ", ".join(self.where + i.name for i in found[:SHOWN])
        more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        return (f"{len(found)} object(s) ({sum(i.size for i in found)} bytes) under the "
                f"namespace's prefix at names kvtiers-s3 never makes: {shown}{more}; never "
                "read, counted or deleted by the tier, left alone")


def verify_namespace(run: Callable[[Coroutine[Any, Any, Any]], Any], io: IoContext,
                     startup: Scan | None, tier: str, *, repair: bool,
                     progress: Progress | None = None) -> list[VerifyReport]:
    """See the module doc. `run(coro)` runs a coroutine on the tier's loop and waits
    for it (the caller's thread); one report for the namespace's prefix."""
    verifier = _Verifier(io, repair)
    objects = sorted(io.holdings.objects(), key=lambda o: o.name)
    total = sum(len(o.members) for o in objects)
    at_opening: list[BadBlock] = run(verifier.at_opening(startup))
    done = 0
    for at in range(0, len(objects), PIECE):
        piece = objects[at:at + PIECE]
        done += sum(len(o.members) for o in piece)  # counted before the check drops any
        run(verifier.piece(piece))
        if progress is not None:
            progress(done, total)
    stranger: str | None = run(verifier.strangers())
    tally = verifier.tally
    notes = []
    if at_opening:
        notes.append(f"{sum(b.removed for b in at_opening)} broken object(s) were deleted "
                     "when the tier opened")
    if tally.foreign:
        notes.append(f"{tally.foreign} object(s) at the tier's names are not provably its "
                     "own (no kvtiers-s3 magic, or another namespace's or format's): "
                     "reported, never deleted")
    if tally.lost:
        notes.append(f"{tally.lost} good block(s) were deleted with their damaged segments")
    if stranger:
        notes.append(stranger)
    return [VerifyReport(tier, io.fingerprint, f"{io.settings.protocol}://{io.ns_root}",
                         checked=tally.checked, bad=(*at_opening, *tally.bad),
                         vanished=tally.vanished, removed_bytes=tally.removed_bytes,
                         notes=tuple(notes))]
