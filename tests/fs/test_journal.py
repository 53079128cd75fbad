"""The journal read in pieces gives the frames a whole read gives; snapshots are
written in pieces and read back with their base; names and heads of other versions
or impossible generations are refused."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from kvtiers.sdk import ErrorCounts
from kvtiers.testing import random_keys
from kvtiers_fs.journal import files
from kvtiers_fs.journal import records as jr
from kvtiers_fs.journal.records import Record

_log = logging.getLogger("test")


def _frames(n: int) -> list[list[Record]]:
    keys = random_keys(n * 3)
    return [[Record(jr.ADD, 7, 100 + i, k) for k in keys[3 * i : 3 * i + 3]] for i in range(n)]


def test_reading_in_pieces_gives_the_same_frames(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    frames = _frames(500)
    big = [Record(jr.ADD, 1, 1, k) for k in random_keys(5000)]  # one frame > a piece
    data = b"".join(jr.frame(f) for f in [*frames, big, *frames[:3]])
    path = tmp_path / "journal.1"
    path.write_bytes(data + jr.frame(frames[0])[:50])  # and a torn tail
    fd = os.open(path, os.O_RDONLY)
    try:
        whole = jr.read_frames(fd, 0)
        pieces, offset, torn = [], 0, False
        while True:
            tail = jr.read_frames(fd, offset, 4096)
            pieces += tail.frames
            offset, torn = tail.offset, tail.torn
            if not tail.frames:
                break
        assert pieces == whole.frames == [*frames, big, *frames[:3]]
        assert offset == whole.offset == len(data) and torn and whole.torn
    finally:
        os.close(fd)


def test_damage_before_the_end_is_not_a_torn_tail(tmp_path: Path) -> None:
    data = bytearray(b"".join(jr.frame(f) for f in _frames(20)))
    data[200] ^= 1
    path = tmp_path / "journal.1"
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(jr.JournalCorrupt):
            jr.read_frames(fd, 0, 1024)
    finally:
        os.close(fd)


def test_a_snapshot_written_in_pieces_reads_back_with_its_base(tmp_path: Path) -> None:
    ns_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        keys = random_keys(3000)
        entries = [(k, 8192) for k in keys]
        pieces = [entries[i : i + 1000] for i in range(0, 3000, 1000)]
        pending = [(random_keys(1)[0], (9, 8192))]
        lastdel = [(9, keys[0])]
        files.write_snapshot(ns_fd, "snapshot.8", 8, iter(pieces), pending, lastdel,
                            blocks=3000, nbytes=3000 * 8192, base_gen=7, base_offset=4160,
                            durable=False)
        snap = files.read_snapshot(ns_fd, 8)
        assert (snap.gen, snap.base_gen, snap.base_offset, snap.blocks) == (8, 7, 4160, 3000)
        recs = [(op, raw[:n], w, s) for op, n, w, s, raw in jr.raw_records(snap.body)]
        assert [r[1] for r in recs if r[0] == jr.ENTRY] == keys
        assert [(r[1], r[2]) for r in recs if r[0] == jr.ADD] == [(pending[0][0], 9)]
        with pytest.raises(ValueError, match="another generation"):
            os.rename("snapshot.8", "snapshot.9", src_dir_fd=ns_fd, dst_dir_fd=ns_fd)
            files.read_snapshot(ns_fd, 9)
    finally:
        os.close(ns_fd)


@pytest.mark.parametrize("gen,base_gen,base_offset", [(5, 3, 0), (5, 6, 0), (5, 5, 64),
                                                      (0, 0, 0), (jr.MAX_GENERATION, 1, 0)])
def test_snapshot_heads_with_impossible_bases_are_refused(gen: int, base_gen: int,
                                                          base_offset: int) -> None:
    data = jr.pack_snapshot(gen, [], 0, 0, base_gen, base_offset)
    with pytest.raises(ValueError):
        jr.read_snapshot_head(data)


def test_old_generations_are_removed_but_planted_directories_left(tmp_path: Path) -> None:
    for name in ("snapshot.3", "snapshot.4", "journal.2", "journal.3", "journal.4",
                 ".snapshot.5.00000000000000ab.tmp", ".snapshot.5.00000000000000cd.tmp"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "snapshot.2").mkdir()
    ns_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        files.remove_old(ns_fd, 4, [0xAB], ErrorCounts(_log, "kvtiers-fs t"))
    finally:
        os.close(ns_fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".snapshot.5.00000000000000cd.tmp", "journal.3", "journal.4", "snapshot.2",
        "snapshot.4"]
