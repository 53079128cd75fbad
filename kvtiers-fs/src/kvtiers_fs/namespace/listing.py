"""`list_namespaces(root)`: which models keep blocks under a root directory.

For `kvtiers validate` and the tier's start-up log: another model's namespace on
the same root is listed, never opened for writing, never touched. Reads only
`<fingerprint>/NAMESPACE.json`, the newest snapshot and its journal (to count the
blocks, without opening any block file or taking any lock). Never follows a
symlink; never raises for a damaged or hostile namespace directory - any name or
content (a NAMESPACE.json that is not an object, a snapshot that is a directory, a
journal of garbage) lists that namespace with an `error` saying why, or without
counts.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Any

from kvtiers.sdk import Namespace

from kvtiers_fs.disk import layout
from kvtiers_fs.journal import records as jr

_log = logging.getLogger("kvtiers.fs")
NAMESPACE_FILE = "NAMESPACE.json"


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
    return len(name) == 32 and layout.is_lower_hex(name)


def list_namespaces(root: str, *, exclude: str | None = None,
                    counts: bool = True) -> list[NamespaceInfo]:
    """Every namespace directory under `root` (but `exclude`), sorted by
    fingerprint; without `counts`, blocks and bytes are not read. Raises OSError
    only if `root` itself cannot be opened (missing, a symlink, not a directory)."""
    root_fd = layout.open_root(root)
    try:
        names = sorted(n for n in os.listdir(root_fd) if _is_fingerprint(n) and n != exclude)
        return [_describe_safely(root, root_fd, n, counts) for n in names]
    finally:
        os.close(root_fd)


def _describe_safely(root: str, root_fd: int, fingerprint: str,
                     counts: bool) -> NamespaceInfo:
    try:
        return _describe(root, root_fd, fingerprint, counts)
    except Exception as exc:  # noqa: BLE001 - documented never to raise for content
        _log.warning("kvtiers-fs %s: cannot describe namespace %s: %r", root, fingerprint, exc)
        return NamespaceInfo(fingerprint, os.path.join(root, fingerprint),
                             error=f"unreadable: {type(exc).__name__}: {exc}")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _describe(root: str, root_fd: int, fingerprint: str, counts: bool) -> NamespaceInfo:
    path = os.path.join(root, fingerprint)
    try:
        ns_fd = layout.open_dir(fingerprint, root_fd)
    except OSError as exc:
        return NamespaceInfo(fingerprint, path, error=f"cannot open: {exc.strerror}")
    try:
        try:
            doc = json.loads(layout.read_small_file(NAMESPACE_FILE, ns_fd))
        except (OSError, ValueError, RecursionError) as exc:
            return NamespaceInfo(fingerprint, path, error=f"no readable NAMESPACE.json: {exc}")
        if not isinstance(doc, dict) or _text(doc.get("model")) is None:
            return NamespaceInfo(fingerprint, path, error="NAMESPACE.json is not a "
                                 "namespace description (an object with a \"model\")")
        blocks, nbytes = _count(ns_fd) if counts else (None, None)
        return NamespaceInfo(fingerprint, path, _text(doc.get("model")),
                             _text(doc.get("revision")) or "", blocks, nbytes)
    finally:
        os.close(ns_fd)


def _count(ns_fd: int) -> tuple[int | None, int | None]:
    """(committed blocks, their bytes): the newest snapshot's, plus the journal from
    the snapshot's base on (following ROTATE)."""
    gens = [g for n in os.listdir(ns_fd) if (g := jr.generation_of(n, "snapshot")) is not None]
    if not gens:
        return None, None
    gen = max(gens)
    try:
        snap = jr.parse_snapshot(layout.read_file(jr.snapshot_name(gen), ns_fd))
    except (OSError, ValueError):
        return None, None
    blocks, nbytes = snap.blocks, snap.bytes
    pending = {raw[:n]: (writer, size) for op, n, writer, size, raw in jr.raw_records(snap.body)
               if op == jr.ADD}
    jgen, offset = snap.base_gen, snap.base_offset
    for _ in range(3):  # the base journal, then the one its ROTATE names
        try:
            fd = layout.open_file(jr.journal_name(jgen), ns_fd, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return blocks, nbytes
        try:
            frames = jr.read_frames(fd, offset).frames
        except (OSError, jr.JournalCorrupt):
            return blocks, nbytes
        finally:
            os.close(fd)
        follow = None
        for records in frames:
            for r in records:
                if r.op == jr.ADD:
                    pending[r.ident] = (r.writer, r.size)
                elif r.op == jr.COMMIT:
                    p = pending.get(r.ident)
                    if p is not None and p[0] == r.writer:
                        del pending[r.ident]
                        blocks += 1
                        nbytes += p[1]
                elif r.op == jr.ABORT:
                    p = pending.get(r.ident)
                    if p is not None and p[0] == r.writer:
                        del pending[r.ident]
                elif r.op in (jr.REMOVE, jr.FORGET):
                    blocks -= 1
                    nbytes -= r.size
                elif r.op == jr.ROTATE:
                    follow = r.size
        if follow is None:
            break
        jgen, offset = follow, 0
    return blocks, nbytes


def write_namespace_file(ns_fd: int, namespace: Namespace, *, durable: bool,
                         logger: logging.Logger, where: str) -> None:
    """NAMESPACE.json of a namespace directory this process opens: written when
    missing or not a description of this namespace (ours to replace). It is only
    informational, so a name there that cannot be replaced (a directory) is logged
    and left."""
    try:
        doc = json.loads(layout.read_small_file(NAMESPACE_FILE, ns_fd))
        if isinstance(doc, dict) and doc.get("fingerprint") == namespace.fingerprint:
            return
    except (OSError, ValueError, RecursionError):
        pass  # missing, unreadable or garbage: rewritten
    doc = {
        "fingerprint": namespace.fingerprint,
        "model": namespace.model,
        "revision": namespace.revision,
        "format_version": namespace.format_version,
        "groups": [asdict(g) for g in namespace.groups],
        "layout_version": layout.LAYOUT_VERSION,
        "snapshot_version": jr.SNAP_VERSION,
    }
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    try:
        layout.write_small_file(NAMESPACE_FILE, ns_fd, data, durable=durable)
    except OSError as exc:
        logger.warning("kvtiers-fs %s: cannot write %s/%s (%s); continuing without it",
                       where, namespace.fingerprint, NAMESPACE_FILE, exc)
