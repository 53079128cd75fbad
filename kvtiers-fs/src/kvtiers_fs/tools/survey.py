"""`survey(roots)`: what every namespace under the fs tier's roots holds - ours and
other models' - read without opening the tier (`kvtiers inspect`).

Read-only: it opens directories and files for reading only, never takes the
namespace lock, registers no writer, settles nothing, writes nothing. So it is safe
beside live engines on a shared root, and it sees what they committed: per
namespace it reads `NAMESPACE.json` (model, revision, geometry), the newest
snapshot and the journal from the snapshot's base on (following ROTATE), folding
the records as `BlockIndex.apply` does - committed blocks with their file sizes,
and intents still pending (reserved bytes). A rotation that removes the files it
is reading makes it start again from the newest snapshot (a few times, then it
reports what it has with an `error`). Keys come from the idents (the file header
for long keys); ages, when asked, from each file's mtime (a stat per block).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtiers.sdk import BlockRecord, ErrorCounts, NamespaceInventory

from kvtiers_fs.disk import layout
from kvtiers_fs.disk.blockdir import BlockDir
from kvtiers_fs.disk.layout import Ident
from kvtiers_fs.journal import records as jr
from kvtiers_fs.journal.files import generations, read_snapshot
from kvtiers_fs.namespace.listing import NAMESPACE_FILE

_log = logging.getLogger("kvtiers.fs.survey")
#: how many times a read that a concurrent rotation overtook starts again
ATTEMPTS = 5


class _Overtaken(Exception):
    """A file the read needed went away (a rotation finished): start again."""


@dataclass
class IndexState:
    """A namespace's index as folded from its snapshot and journal."""

    sizes: dict[Ident, int] = field(default_factory=dict)
    pending: dict[Ident, tuple[int, int]] = field(default_factory=dict)


def survey(roots: Sequence[str], *, capacity_bytes: int | None,
           ages: bool = False) -> list[NamespaceInventory]:
    """One `NamespaceInventory` per namespace directory and root, roots in order,
    namespaces by fingerprint. Raises OSError only for a root that cannot be opened;
    a damaged namespace is listed with an `error`."""
    out: list[NamespaceInventory] = []
    for root in roots:
        root_fd = layout.open_root(root)
        try:
            names = sorted(n for n in os.listdir(root_fd)
                           if len(n) == 32 and layout.is_lower_hex(n))
            for fp in names:
                out.append(_namespace(root, root_fd, fp, capacity_bytes, ages))
        finally:
            os.close(root_fd)
    return out


def describe(doc: Any) -> tuple[str | None, str | None, tuple[Mapping[str, Any], ...]]:
    """(model, revision, geometry per group) from a NAMESPACE.json document."""
    if not isinstance(doc, dict):
        return None, None, ()
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    revision = doc.get("revision") if isinstance(doc.get("revision"), str) else None
    groups = doc.get("groups")
    geometry = tuple(dict(g) for g in groups if isinstance(g, dict)) \
        if isinstance(groups, list) else ()
    return model, revision, geometry


def _namespace(root: str, root_fd: int, fp: str, capacity: int | None,
               ages: bool) -> NamespaceInventory:
    where = os.path.join(root, fp)
    try:
        ns_fd = layout.open_dir(fp, root_fd)
    except OSError as exc:
        return NamespaceInventory(fp, where, (), 0, capacity_bytes=capacity,
                                  error=f"cannot open: {exc.strerror}")
    try:
        try:
            doc = json.loads(layout.read_small_file(NAMESPACE_FILE, ns_fd))
        except (OSError, ValueError, RecursionError):
            doc = None
        model, revision, geometry = describe(doc)
        error = None if model else f"no readable {NAMESPACE_FILE}"
        try:
            state = read_index(ns_fd)
        except (OSError, ValueError, jr.JournalCorrupt, _Overtaken) as exc:
            state, error = IndexState(), f"index unreadable: {exc}"
        entries = list(state.sizes.items())
        records: list[BlockRecord] = []
        unnamed = len(entries)
        try:
            blocks_fd = layout.open_dir("blocks", ns_fd)
        except OSError as exc:
            error = error or f"no blocks directory: {exc.strerror}"
        else:
            try:
                bdir = BlockDir(blocks_fd, fp, ErrorCounts(_log, f"kvtiers-fs {root}"))
                records, unnamed = bdir.records(entries, ages=ages)
            finally:
                os.close(blocks_fd)
        return NamespaceInventory(
            fp, root, tuple(records), committed_bytes=sum(s for _, s in entries),
            reserved_bytes=sum(s for _, s in state.pending.values()),
            reserved_blocks=len(state.pending), capacity_bytes=capacity,
            unnamed_blocks=unnamed, model=model, revision=revision, geometry=geometry,
            error=error)
    finally:
        os.close(ns_fd)


def read_index(ns_fd: int) -> IndexState:
    """The index of the namespace open at `ns_fd`: the newest snapshot plus its
    journal. Raises OSError/ValueError for a damaged one, `_Overtaken` when
    rotations kept removing what it was reading."""
    for _ in range(ATTEMPTS):
        try:
            return _read_once(ns_fd)
        except _Overtaken:
            continue
    raise _Overtaken("the journal was rotated under every attempt to read it")


def _read_once(ns_fd: int) -> IndexState:
    gen, _ = generations(ns_fd)
    if gen is None:
        return IndexState()  # created, nothing loaded yet
    try:
        snap = read_snapshot(ns_fd, gen)
    except FileNotFoundError as exc:
        raise _Overtaken() from exc
    state = IndexState()
    for op, n, writer, size, raw in jr.raw_records(snap.body):
        if op == jr.ENTRY:
            state.sizes[raw[:n]] = size
        elif op == jr.ADD:
            state.pending[raw[:n]] = (writer, size)
    jgen, offset = snap.base_gen, snap.base_offset
    for _ in range(ATTEMPTS):
        try:
            fd = layout.open_file(jr.journal_name(jgen), ns_fd, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError as exc:
            raise _Overtaken() from exc
        try:
            frames = jr.read_frames(fd, offset).frames
        finally:
            os.close(fd)
        nxt = _fold(state, frames)
        if nxt is None:
            return state
        op, g = nxt
        if op == jr.RELOAD:
            raise _Overtaken()  # a rebuild replaced the state: from its snapshot
        jgen, offset = g, 0
    raise _Overtaken()


def _fold(state: IndexState, frames: list[list[jr.Record]]) -> tuple[int, int] | None:
    """Apply frames as `BlockIndex.apply` does; (op, gen) at a ROTATE/RELOAD."""
    sizes, pending = state.sizes, state.pending
    for records in frames:
        for r in records:
            op, idn = r.op, r.ident
            if op == jr.ADD:
                if idn not in pending and idn not in sizes:
                    pending[idn] = (r.writer, r.size)
            elif op == jr.COMMIT:
                p = pending.get(idn)
                if p is not None:
                    if p[0] == r.writer:
                        del pending[idn]
                        sizes.setdefault(idn, p[1])
                elif idn not in sizes and r.size:
                    sizes[idn] = r.size
            elif op == jr.ABORT:
                p = pending.get(idn)
                if p is not None and p[0] == r.writer:
                    del pending[idn]
            elif op in (jr.REMOVE, jr.FORGET):
                sizes.pop(idn, None)
            elif op in (jr.ROTATE, jr.RELOAD):
                return op, r.size
    return None


__all__ = ["IndexState", "describe", "read_index", "survey"]
