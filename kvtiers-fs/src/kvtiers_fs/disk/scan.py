"""A full scan of a namespace's block files: the fallback that rebuilds the index
when there is no usable snapshot or journal (a namespace directory written before
the journal existed, or one damaged by a power loss without `durable`).

Only names are read, plus one `lstat` per block file (its size and mtime); no file
is opened (loads verify each block later). Symlinks and other non-regular entries
are ignored, never followed; so are names this layout does not write, and block
files in a shard that is not theirs (copied there). Temporary files of dead writers
are removed; nothing else is.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable

from kvtiers_fs.disk import layout
from kvtiers_fs.disk.layout import Ident


def scan_blocks(
    blocks_fd: int, writer_dead: Callable[[int], bool]
) -> list[tuple[int, Ident, int]]:
    """(mtime_ns, ident, file bytes) of every block file, oldest first."""
    found: list[tuple[int, Ident, int]] = []
    with os.scandir(blocks_fd) as shards:
        names = [e.name for e in shards if len(e.name) == 3 and layout.is_lower_hex(e.name)
                 and e.is_dir(follow_symlinks=False)]
    for name in names:
        try:
            shard = layout.open_dir(name, blocks_fd)
        except OSError:
            continue  # a symlink swapped in, or gone: not ours to read
        try:
            with os.scandir(shard) as entries:
                for e in entries:
                    idn = layout.parse_block_name(e.name)
                    if idn is not None and layout.shard_of(idn) == name:
                        try:
                            st = e.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if stat.S_ISREG(st.st_mode):
                            found.append((st.st_mtime_ns, idn, st.st_size))
                        continue
                    if idn is not None:
                        continue
                    writer = layout.parse_tmp_name(e.name)
                    if writer is not None and e.is_file(follow_symlinks=False) \
                            and writer_dead(writer):
                        with contextlib.suppress(OSError):
                            layout.unlink_quiet(e.name, shard)
        finally:
            os.close(shard)
    found.sort()
    return found
