"""`BlockDir`: the metadata operations on one namespace's `blocks/` directory -
opening shards, removing block and temporary files, moving an evicted block's file
to a new block's temporary name, checking a file that a dead writer left.

Everything here is best effort and never raises for what it finds in the tree: a
shard that is a symlink, a file, a FIFO, or gone is "not there" (a symlink is
never followed: `layout.open_dir`); errors other than a missing name are counted
once per kind in the `ErrorCounts`. That matters because these calls run after a
journal frame is appended: what the frame says must be fully applied in memory
whatever the files look like, or reservations leak (issue 11, item 2).

Thread-safe (no state besides the directory descriptor); I/O threads only.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable

from kvtiers.sdk import BlockRecord, ErrorCounts

from kvtiers_fs.disk import layout
from kvtiers_fs.disk.blockio import verify_block_file
from kvtiers_fs.disk.layout import Ident
from kvtiers_fs.pacing import CHUNK, pause


class BlockDir:
    def __init__(self, blocks_fd: int, namespace: str, errors: ErrorCounts):
        self.fd = blocks_fd
        self.namespace = namespace
        self._errors = errors

    def shard(self, idn: Ident, *, create: bool) -> int:
        """A descriptor of the shard directory of `idn` (the caller closes it).
        Raises OSError: FileNotFoundError, or ELOOP/ENOTDIR for a planted link."""
        return layout.open_dir(layout.shard_of(idn), self.fd, create=create)

    def shard_or_none(self, idn: Ident) -> int | None:
        """`shard(idn)`, or None when there is no usable shard directory."""
        try:
            return self.shard(idn, create=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._errors.record("shard", exc, layout.shard_of(idn))
            return None

    def unlink_blocks(self, idns: Iterable[Ident]) -> None:
        self._unlink_each(idns, layout.block_name)

    def unlink_tmps(self, idns: Iterable[Ident], writer: int) -> None:
        """`writer`'s temporary files of `idns`, where they are left."""
        self._unlink_each(idns, lambda idn: layout.tmp_name(idn, writer))

    def _unlink_each(self, idns: Iterable[Ident], name: Callable[[Ident], str]) -> None:
        for idn in idns:
            shard = self.shard_or_none(idn)
            if shard is None:
                continue
            try:
                layout.unlink_quiet(name(idn), shard)
            except OSError as exc:  # EISDIR for a planted directory, EPERM, EROFS...
                self._errors.record("unlink", exc)
            finally:
                os.close(shard)

    def recycle(self, victim: Ident, idn: Ident, size: int, writer: int) -> bool:
        """Move the file of `victim` (evicted: its REMOVE is in the journal) to the
        temporary name of `idn` (see `RootStore.reserve`). False - the caller
        unlinks the victim - when it is not a regular file of `size` bytes, or
        anything fails."""
        src = self.shard_or_none(victim)
        if src is None:
            return False
        try:
            name = layout.block_name(victim)
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                return False
            dst = self.shard(idn, create=True)
            try:
                os.rename(name, layout.tmp_name(idn, writer), src_dir_fd=src, dst_dir_fd=dst)
            finally:
                os.close(dst)
            return True
        except OSError:
            return False
        finally:
            os.close(src)

    def settle_file(self, idn: Ident, writer: int, size: int) -> bool:
        """For an intent of `writer`, who died: remove its temporary file and say
        whether a complete, valid copy of the block is at its name (then the intent
        is committed; else aborted). Reads the whole file to verify it."""
        shard = self.shard_or_none(idn)
        if shard is None:
            return False
        try:
            try:
                layout.unlink_quiet(layout.tmp_name(idn, writer), shard)
            except OSError as exc:
                self._errors.record("unlink", exc)
            return verify_block_file(shard, layout.block_name(idn), self.namespace, idn,
                                     size) is None
        finally:
            os.close(shard)

    def holds_copy(self, idn: Ident, size: int) -> bool:
        """Whether a complete, valid copy of `idn` (`size` bytes) is at its name now
        (read and verified: for the rare load that found something else there)."""
        shard = self.shard_or_none(idn)
        if shard is None:
            return False
        try:
            return verify_block_file(shard, layout.block_name(idn), self.namespace, idn,
                                     size) is None
        finally:
            os.close(shard)

    def keys(self, idns: Iterable[Ident]) -> list[bytes]:
        """The keys of `idns`: the ident itself, or (a long key's hash) the key in its
        file's header; idents that cannot be named are left out."""
        out = []
        for idn in idns:
            key = layout.key_of(idn)
            if key is None:
                key = self.key_from_header(idn)
            if key is not None:
                out.append(key)
        return out

    def records(self, entries: list[tuple[Ident, int]], *,
                ages: bool) -> tuple[list[BlockRecord], int]:
        """Inventory records of committed blocks (ident, file bytes), and how many
        could not be named; with `ages`, each file's mtime (a stat per block)."""
        records: list[BlockRecord] = []
        unnamed = 0
        for n, (idn, size) in enumerate(entries, 1):
            key = layout.key_of(idn)
            if key is None:
                key = self.key_from_header(idn)
            if key is None:
                unnamed += 1
            else:
                records.append(BlockRecord(key, size, self.stored_at(idn) if ages else None))
            if n % CHUNK == 0:
                pause()
        return records, unnamed

    def key_from_header(self, idn: Ident) -> bytes | None:
        """The key a block file names in its header (for hashed idents; None when
        there is no readable header)."""
        shard = self.shard_or_none(idn)
        if shard is None:
            return None
        try:
            fd = layout.open_file(layout.block_name(idn), shard, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        finally:
            os.close(shard)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            h = layout.parse_header(os.pread(fd, layout.HEADER_BYTES, 0))
        except (OSError, layout.HeaderError):
            return None
        finally:
            os.close(fd)
        return h.key if layout.ident(h.key) == idn and h.namespace == self.namespace else None

    def stored_at(self, idn: Ident) -> float | None:
        """The modification time of the block file of `idn` (when its bytes were
        written), or None."""
        shard = self.shard_or_none(idn)  # never through a link planted as the shard
        if shard is None:
            return None
        try:
            st = os.stat(layout.block_name(idn), dir_fd=shard, follow_symlinks=False)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                self._errors.record("stat", exc)
            return None
        finally:
            os.close(shard)
        return st.st_mtime if stat.S_ISREG(st.st_mode) else None
