"""The room a namespace needs on its root's filesystem beyond `capacity_bytes` of
block files: journals, snapshots, small files and (on disk filesystems) the
directories. The store keeps its metadata within this (`journal_limit`: past it,
the lock holder compacts the journal into a new generation); `kvtiers validate`
refuses a capacity that leaves no room for it (`schema.check_machine`).

What it covers, for a capacity C and block files of F bytes (N = C // F blocks):

- journals: the current one and the previous one, each at most `journal_limit(C)`
  plus the frames of one critical section (at most about a snapshot's worth);
- snapshots: the newest, one being written in the background and one being
  written by a compaction - a snapshot is 64 bytes per block plus room for
  `LASTDEL_RECORDS` removals;
- `SMALL_FILES_BYTES`: NAMESPACE.json, the lock files;
- directories, where they take space (not on tmpfs/ramfs): the 4096 shard
  directories and the namespace's own, one filesystem block each, plus
  `DIRENT_BYTES` per block file.

Not covered: a process that lags a generation behind (stopped with SIGSTOP, say)
keeps the journal it has open; a removed journal's space comes back only when it
closes it (one journal, at most `journal_limit(C)`, per such process).

Pure functions, any thread.
"""

from __future__ import annotations

# Figures of the on-disk formats, stated here so that `kvtiers validate` (schema.py)
# imports no tier code; tests/fs/test_disk_full.py holds them equal to the formats'.
_HEADER_BYTES = 4096  # disk.layout.HEADER_BYTES
_SHARDS = 4096  # disk.layout.SHARDS
_RECORD_BYTES = 64  # journal.records.RECORD.size
_SNAP_HEAD_BYTES = 64  # journal.records.SNAP.size

#: the smallest block file: a 4 KiB header page and one 4 KiB page of block
MIN_FILE_BYTES = 2 * _HEADER_BYTES
#: the journal is compacted once it reaches `journal_limit`: capacity / 64 within these
JOURNAL_LIMIT_MIN = 256 << 10
JOURNAL_LIMIT_MAX = 64 << 20
JOURNAL_LIMIT_SHARE = 64
#: removals of writers' last frames a snapshot may carry beyond one record per block
LASTDEL_RECORDS = 256
#: NAMESPACE.json, `lock`, writers' lock files (empty), with room to spare
SMALL_FILES_BYTES = 64 << 10
#: a directory entry of a block file, with the slack of half-full directory blocks
DIRENT_BYTES = 192
#: frames appended in one critical section, in snapshots' worth (see the module doc)
_FRAME_SLACK = 1
#: snapshot files at once: the newest, a background rotation's, a compaction's
_SNAPSHOTS = 3


def journal_limit(capacity_bytes: int) -> int:
    """The journal size at which the namespace lock holder compacts it."""
    return min(JOURNAL_LIMIT_MAX, max(JOURNAL_LIMIT_MIN, capacity_bytes // JOURNAL_LIMIT_SHARE))


def snapshot_bytes(capacity_bytes: int, file_bytes: int = MIN_FILE_BYTES) -> int:
    """The largest snapshot of a namespace of that capacity and block file size."""
    blocks = capacity_bytes // max(file_bytes, MIN_FILE_BYTES)
    return _SNAP_HEAD_BYTES + _RECORD_BYTES * (blocks + LASTDEL_RECORDS)


def directory_bytes(capacity_bytes: int, file_bytes: int, dir_block: int) -> int:
    """Directories' share; `dir_block` is the filesystem's block size, 0 where
    directories take no space (tmpfs, ramfs)."""
    if dir_block <= 0:
        return 0
    blocks = capacity_bytes // max(file_bytes, MIN_FILE_BYTES)
    return (_SHARDS + 4) * dir_block + DIRENT_BYTES * blocks


def metadata_bytes(capacity_bytes: int, file_bytes: int = MIN_FILE_BYTES,
                   dir_block: int = 4096) -> int:
    """Everything but block files that one namespace of `capacity_bytes` may take on
    its root's filesystem (see the module doc). Without `file_bytes` (what
    `kvtiers validate` knows: the block size comes from the engine), the smallest
    block file, so the figure holds for any block size."""
    snap = snapshot_bytes(capacity_bytes, file_bytes)
    return (2 * (journal_limit(capacity_bytes) + _FRAME_SLACK * snap) + _SNAPSHOTS * snap
            + SMALL_FILES_BYTES + directory_bytes(capacity_bytes, file_bytes, dir_block))


__all__ = ["journal_limit", "metadata_bytes", "snapshot_bytes", "directory_bytes",
           "MIN_FILE_BYTES"]
