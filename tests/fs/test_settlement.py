"""`Settlement`: a dead writer's intents are committed only for complete, verified
files, aborted otherwise (also when the shard is a planted symlink); its temporary
files go; a writer that is alive (its lock held, even if it is stopped) is left
alone. Real files and real flock(2) locks; a dead writer is what the kernel leaves
of one: its `writers/<id>` file, unlocked."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from kvtiers.policies.lru import LRUPolicy
from kvtiers.sdk import ErrorCounts
from kvtiers.testing import random_keys
from kvtiers_fs.disk import layout
from kvtiers_fs.disk.blockdir import BlockDir
from kvtiers_fs.disk.blockio import BlockIO
from kvtiers_fs.journal import records as jr
from kvtiers_fs.journal.index import BlockIndex
from kvtiers_fs.journal.records import Record
from kvtiers_fs.journal.recovery import Settlement
from kvtiers_fs.journal.writers import WriterRegistry

NS = "c" * 32
BB = 8192
FILE = layout.file_bytes(BB)
ME, DEAD, ALIVE = 0x1111, 0x2222, 0x3333
_log = logging.getLogger("test")


def _setup(tmp_path: Path) -> tuple[BlockIndex, BlockDir, WriterRegistry, list[list[Record]]]:
    (tmp_path / "blocks").mkdir()
    (tmp_path / "writers").mkdir()
    blocks_fd = os.open(tmp_path / "blocks", os.O_RDONLY | os.O_DIRECTORY)
    writers_fd = os.open(tmp_path / "writers", os.O_RDONLY | os.O_DIRECTORY)
    errors = ErrorCounts(_log, "kvtiers-fs t")
    index = BlockIndex(LRUPolicy(), 1 << 40)
    frames: list[list[Record]] = []
    return index, BlockDir(blocks_fd, NS, errors), WriterRegistry(writers_fd, ME), frames


def _write(blocks: BlockDir, key: bytes, writer: int, data: bytes) -> Path:
    """A complete block file renamed into place by `writer` (not committed)."""
    shard = blocks.shard(layout.ident(key), create=True)
    try:
        BlockIO(NS, BB, o_direct=False, durable=False).write(
            shard, layout.ident(key), key, writer, memoryview(bytearray(data)))
    finally:
        os.close(shard)
    return Path(f"/proc/self/fd/{blocks.fd}") / layout.block_relpath(layout.ident(key))


def test_a_dead_writers_intents_are_settled_by_what_its_files_prove(tmp_path: Path) -> None:
    index, blocks, writers, frames = _setup(tmp_path)
    settlement = Settlement(index, blocks, writers,
                            lambda recs: (frames.append(recs), index.apply(recs)),
                            ErrorCounts(_log, "kvtiers-fs t"), _log, "t")
    keys = random_keys(5)
    complete, damaged, half, linked, alive = keys
    idns = [layout.ident(k) for k in keys]
    index.apply([Record(jr.ADD, DEAD, FILE, i) for i in idns[:4]])
    index.apply([Record(jr.ADD, ALIVE, FILE, idns[4])])
    data = os.urandom(BB)
    kept = _write(blocks, complete, DEAD, data)
    path = _write(blocks, damaged, DEAD, os.urandom(BB))
    with open(path, "r+b") as f:  # one flipped bit in the block bytes
        f.seek(4096 + 77)
        b = f.read(1)
        f.seek(4096 + 77)
        f.write(bytes([b[0] ^ 4]))
    for key in (half, linked):  # only a half-written temporary file
        shard = blocks.shard(layout.ident(key), create=True)
        fd = os.open(layout.tmp_name(layout.ident(key), DEAD), os.O_WRONLY | os.O_CREAT,
                     0o600, dir_fd=shard)
        os.write(fd, os.urandom(1000))
        os.close(fd)
        os.close(shard)
    shard_dir = tmp_path / "blocks" / layout.shard_of(idns[3])
    if all(layout.shard_of(i) != layout.shard_of(idns[3]) for i in idns[:3]):
        for f in shard_dir.iterdir():
            f.unlink()
        shard_dir.rmdir()
        shard_dir.symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "writers" / f"{DEAD:016x}").write_bytes(b"")  # unlocked: its writer died
    lock = os.open(tmp_path / "writers" / f"{ALIVE:016x}", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # held: alive (a stopped process holds it too)
    try:
        settlement.reconcile()
        (frame,) = frames
        outcome = {r.ident: r.op for r in frame if r.op in (jr.COMMIT, jr.ABORT)}
        assert outcome == {idns[0]: jr.COMMIT, idns[1]: jr.ABORT, idns[2]: jr.ABORT,
                           idns[3]: jr.ABORT}
        assert all(r.writer == DEAD for r in frame if r.op != jr.GONE)
        assert frame[-1].op == jr.GONE and frame[-1].size == DEAD
        assert index.contains(idns[0]) and index.reserved == 1  # ALIVE's intent stays
        assert index.usage == 2 * FILE
        tmps = [p for p in (tmp_path / "blocks").rglob("*.tmp") if not p.is_symlink()]
        assert tmps == [], "a dead writer's temporary file is left"
        assert not (tmp_path / "writers" / f"{DEAD:016x}").exists()
        assert (tmp_path / "writers" / f"{ALIVE:016x}").exists()
        assert kept.read_bytes()[4096 : 4096 + BB] == data  # committed, and left in place
    finally:
        os.close(lock)


def test_settling_again_finds_nothing_to_do(tmp_path: Path) -> None:
    index, blocks, writers, frames = _setup(tmp_path)
    settlement = Settlement(index, blocks, writers,
                            lambda recs: (frames.append(recs), index.apply(recs)),
                            ErrorCounts(_log, "kvtiers-fs t"), _log, "t")
    (key,) = random_keys(1)
    index.apply([Record(jr.ADD, DEAD, FILE, layout.ident(key))])
    settlement.reconcile()
    settlement.reconcile()
    assert len(frames) == 1 and index.reserved == 0 and index.usage == 0
