"""`verify_tier(tier)`: the fs tier's `verify_blocks` - re-read and re-checksum
every committed block of its namespace, root by root (`kvtiers verify`).

Per root: the blocks the index lists after reading what other writers appended
(`RootStore.inventory`), each file read whole (buffered, into a private buffer)
and checked - a regular file of the block's size, a valid header of this layout,
our namespace, the block's own key, the checksum of the bytes. The blocks whose
key the index cannot name (a long key: its file's header names it) are found by
name in the shard directories; other files there are not in the index: counted in
the notes, left alone.

Beside live engines: a check that fails is taken again after reading the journal
once more - a block another process evicted meanwhile (its file unlinked, or
recycled as another block's file) is gone from the index then, and counts as
`vanished`, not bad. With `repair`, a bad block is removed through the store's own
accounting (`RootStore.remove`: a REMOVE record under the namespace lock, then
the unlink), so usage stays exact for every process; a name that is not a regular
file is only dropped from the index (FORGET) and left where it is.
"""

from __future__ import annotations

import os
import stat

from kvtiers.sdk import BadBlock, BlockKey, NamespaceInventory, Progress, VerifyReport, checksum

from kvtiers_fs.disk import layout
from kvtiers_fs.disk.layout import HEADER_BYTES, HeaderError, Ident
from kvtiers_fs.namespace.store import RootStore


class _Checked:
    __slots__ = ("bad", "vanished", "removed_bytes", "done")

    def __init__(self) -> None:
        self.bad: list[BadBlock] = []
        self.vanished = 0
        self.removed_bytes = 0
        self.done = 0


def check_file(shard_fd: int, idn: Ident, namespace: str, size: int,
               key: BlockKey | None) -> tuple[str, str] | None:
    """None if the block file of `idn` in `shard_fd` is a valid block of
    `namespace` of `size` file bytes (with key `key` when given); else (reason,
    detail) with a reason of `kvtiers.contract.verification.REASONS`."""
    name = layout.block_name(idn)
    try:
        st = os.stat(name, dir_fd=shard_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "missing", "no file"
    except OSError as exc:
        return "unreadable", f"cannot stat: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return "not_regular", f"not a regular file (mode {stat.filemode(st.st_mode)})"
    try:
        fd = layout.open_file(name, shard_fd, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return "missing", "no file"
    except OSError as exc:
        return "unreadable", f"cannot open: {exc.strerror}"
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            return "truncated", f"file of {actual} bytes, expected {size}"
        data = os.pread(fd, size, 0)
    except OSError as exc:
        return "unreadable", f"cannot read: {exc.strerror}"
    finally:
        os.close(fd)
    if len(data) != size:
        return "truncated", f"read {len(data)} bytes, expected {size}"
    try:
        h = layout.parse_header(data[:HEADER_BYTES])
    except HeaderError as exc:
        return ("foreign" if exc.foreign else "header"), str(exc)
    if h.namespace != namespace:
        return "foreign", f"a block of namespace {h.namespace}"
    if layout.ident(h.key) != idn or (key is not None and h.key != key):
        return "foreign", "the header names another key"
    if layout.file_bytes(h.block_bytes) != size:
        return "truncated", f"header says {h.block_bytes} block bytes, file holds {size}"
    if checksum(memoryview(data)[HEADER_BYTES : HEADER_BYTES + h.block_bytes]) != h.checksum:
        return "checksum", "the block's bytes do not match its checksum"
    return None


def _check(store: RootStore, idn: Ident, size: int, key: BlockKey | None) -> tuple[str, str] | None:
    shard = store.blocks.shard_or_none(idn)
    if shard is None:
        return "missing", "no shard directory"
    try:
        return check_file(shard, idn, store.fingerprint, size, key)
    finally:
        os.close(shard)


class _Listing:
    """What the blocks directory holds besides the index: the block files by name
    (`idents`), and every other entry (`others`: names the layout does not write,
    block names in a shard that is not theirs, anything that is not a shard
    directory), as paths relative to the blocks directory. A writer's temporary
    file (`.IDENT.WRITER.tmp`) is the tier's own and in neither."""

    __slots__ = ("idents", "others")

    def __init__(self) -> None:
        self.idents: list[Ident] = []
        self.others: list[str] = []


def _list_blocks(store: RootStore) -> _Listing:
    """The blocks directory's entries, never following links."""
    out = _Listing()
    for shard in sorted(os.listdir(store.blocks_fd)):
        if not (len(shard) == 3 and layout.is_lower_hex(shard)):
            out.others.append(shard)
            continue
        try:
            fd = layout.open_dir(shard, store.blocks_fd)
        except OSError:
            out.others.append(shard)  # a link or a file at a shard's name: not ours
            continue
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        for name in sorted(names):
            idn = layout.parse_block_name(name)
            if idn is not None and layout.shard_of(idn) == shard:
                out.idents.append(idn)
            elif layout.parse_tmp_name(name) is None:
                out.others.append(f"{shard}/{name}")
    return out


def _others_note(store: RootStore, others: list[str]) -> str:
    shown = ", ".join(others[:3]) + (f", ... ({len(others) - 3} more)" if len(others) > 3
                                      else "")
    where = os.path.join(store.root, store.fingerprint, "blocks")
    return (f"{len(others)} entr{'y' if len(others) == 1 else 'ies'} in {where} that this "
            f"tier did not write: {shown}; left alone (remove them yourself if they are "
            "not needed)")


def verify_root(store: RootStore, tier: str, file_bytes: int, *, repair: bool,
                progress: Progress | None = None, inv: NamespaceInventory | None = None,
                done_before: int = 0, total: int = 0) -> VerifyReport:
    """One root of the tier (`inv`: its inventory, if taken already): see the
    module docstring."""
    inv = store.inventory() if inv is None else inv
    named = {layout.ident(b.key): b for b in inv.blocks}
    result = _Checked()
    total = total or len(inv.blocks) + inv.unnamed_blocks

    def one(idn: Ident, size: int, key: BlockKey | None) -> None:
        found = _check(store, idn, size, key)
        if found is not None:
            store.sync()  # another writer may have removed it meanwhile
            if not store.contains(idn):
                result.vanished += 1
                return
            found = _check(store, idn, size, key)  # or replaced it by a good copy
        if found is not None:
            reason, detail = found
            removed = repair and store.remove(idn, delete_file=reason != "not_regular")
            if removed:
                result.removed_bytes += size
            where = os.path.join(store.root, store.fingerprint, "blocks",
                                 layout.block_relpath(idn))
            result.bad.append(BadBlock(key, reason, detail, where, removed))
        result.done += 1
        if progress is not None:
            progress(done_before + result.done, total)

    for idn, rec in named.items():
        one(idn, rec.size, rec.key)
    listing = _list_blocks(store)
    stray = 0  # the blocks the index cannot name, and files it does not list
    for idn in listing.idents:
        if idn in named:
            continue
        if store.contains(idn):
            one(idn, file_bytes, None)
        else:
            stray += 1
    notes: tuple[str, ...] = ()
    if stray:
        notes += (f"{stray} block file(s) not in the index: left alone (a live writer's "
                  "block not committed yet, or a file that is not ours)",)
    if listing.others:
        notes += (_others_note(store, listing.others),)
    return VerifyReport(tier, store.fingerprint, store.root, result.done, tuple(result.bad),
                        result.vanished, result.removed_bytes, notes)


def verify_tier(stores: list[RootStore], tier: str, file_bytes: int, *, repair: bool,
                progress: Progress | None = None) -> list[VerifyReport]:
    """Every root of the tier, in order; `progress(done, total)` over all roots (the
    total is what the indexes listed at the start)."""
    invs = [s.inventory() for s in stores]
    total = sum(len(i.blocks) + i.unnamed_blocks for i in invs)
    reports: list[VerifyReport] = []
    done = 0
    for store, inv in zip(stores, invs, strict=True):
        r = verify_root(store, tier, file_bytes, repair=repair, progress=progress,
                        inv=inv, done_before=done, total=max(total, 1))
        done += r.checked
        reports.append(r)
    return reports


__all__ = ["check_file", "verify_root", "verify_tier"]
