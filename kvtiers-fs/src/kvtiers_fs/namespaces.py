"""`list_namespaces(root)`: which models keep blocks under a root directory.

For `kvtiers validate` and the tier's start-up log: another model's namespace on
the same root is listed, never opened for writing, never touched. Reads only
`<fingerprint>/NAMESPACE.json`, the newest snapshot and its journal (to count the
blocks, without opening any block file or taking any lock). Never follows a
symlink; never raises for a damaged namespace (it is listed with an `error`, or
without counts).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from kvtiers_fs import journal as jr
from kvtiers_fs import layout


@dataclass(frozen=True)
class NamespaceInfo:
    fingerprint: str
    path: str
    model: str | None = None
    revision: str | None = None
    blocks: int | None = None
    bytes: int | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        if self.error:
            return f"{self.fingerprint} ({self.error})"
        who = f"{self.model}@{self.revision or '-'}"
        size = "" if self.blocks is None else f", {self.blocks} blocks, {self.bytes} bytes"
        return f"{who} [{self.fingerprint[:12]}]{size}"


def _is_fingerprint(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def list_namespaces(root: str, *, exclude: str | None = None,
                    counts: bool = True) -> list[NamespaceInfo]:
    """Every namespace directory under `root` (but `exclude`), sorted by
    fingerprint; without `counts`, blocks and bytes are not read. Raises OSError
    only if `root` itself cannot be opened (missing, a symlink, not a directory)."""
    root_fd = layout.open_root(root)
    try:
        names = sorted(n for n in os.listdir(root_fd) if _is_fingerprint(n) and n != exclude)
        return [_describe(root, root_fd, n, counts) for n in names]
    finally:
        os.close(root_fd)


def _describe(root: str, root_fd: int, fingerprint: str, counts: bool) -> NamespaceInfo:
    path = os.path.join(root, fingerprint)
    try:
        ns_fd = layout.open_dir(fingerprint, root_fd)
    except OSError as exc:
        return NamespaceInfo(fingerprint, path, error=f"cannot open: {exc.strerror}")
    try:
        try:
            doc = json.loads(layout.read_small_file("NAMESPACE.json", ns_fd))
        except (OSError, ValueError) as exc:
            return NamespaceInfo(fingerprint, path, error=f"no readable NAMESPACE.json: {exc}")
        blocks, nbytes = _count(ns_fd) if counts else (None, None)
        return NamespaceInfo(fingerprint, path, str(doc.get("model")),
                             str(doc.get("revision", "")), blocks, nbytes)
    finally:
        os.close(ns_fd)


def _count(ns_fd: int) -> tuple[int | None, int | None]:
    """(committed blocks, their bytes): the newest snapshot's, plus its journal."""
    gens = [g for n in os.listdir(ns_fd) if (g := jr.generation_of(n, "snapshot")) is not None]
    if not gens:
        return None, None
    gen = max(gens)
    try:
        snap = jr.parse_snapshot(layout.read_file(jr.snapshot_name(gen), ns_fd))
    except (OSError, ValueError):
        return None, None
    blocks, nbytes = snap.blocks, snap.bytes
    pending = {raw[:n]: size for op, n, _, size, raw in jr.raw_records(snap.body)
               if op == jr.ADD}
    try:
        fd = layout.open_file(jr.journal_name(gen), ns_fd, os.O_RDONLY)
    except OSError:
        return blocks, nbytes
    try:
        frames = jr.read_frames(fd, 0).frames
    except (OSError, jr.JournalCorrupt):
        return blocks, nbytes
    finally:
        os.close(fd)
    for records in frames:
        for r in records:
            if r.op == jr.ADD:
                pending[r.ident] = r.size
            elif r.op == jr.COMMIT and r.ident in pending:
                blocks += 1
                nbytes += pending.pop(r.ident)
            elif r.op == jr.ABORT:
                pending.pop(r.ident, None)
            elif r.op in (jr.REMOVE, jr.FORGET):
                blocks -= 1
                nbytes -= r.size
    return blocks, nbytes
