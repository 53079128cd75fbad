"""Where a snapshot may be saved (`kvtiers.ops.snapshot_target`): a path holding a
user's files is refused, named with what it holds, and left as it was (`--overwrite`
or not); a kvtiers snapshot is replaced only with `--overwrite`; `file://` URLs and
`~` work like plain paths; an empty directory - a mount point included - is kept
and filled; a save that fails part-way (an exception, a full disk, a failed swap)
or is killed -9 at any point leaves the old snapshot loadable byte for byte."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers.contract.lookup import LookupResult
from kvtiers.testing import random_keys

from tests.fs.helpers import FILE, context, load_and_check, mounted, open_tier, store_keys

from .conftest import REPO, fs_config, kvtiers

pytest.importorskip("zarr")
from kvtiers.ops.snapshot_store import SnapshotError, SnapshotReader

from .save_child import BLOCK_BYTES, blocks, save

CAP = 200 * FILE
N = 80  # blocks of the in-process and child saves: three chunks of rows


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` (relative name: bytes), links not followed."""
    out: dict[str, bytes] = {}
    for here, _, files in os.walk(path):
        for name in files:
            p = Path(here) / name
            out[str(p.relative_to(path))] = p.read_bytes()
    return out


def _content(url: str) -> list[tuple[bytes, bytes]]:
    """(key, bytes) of a snapshot, in its order; each block checked by its checksum."""
    from kvtiers.sdk import checksum

    reader = SnapshotReader(url)
    out = []
    for chunk in reader.chunks():
        for key, digest, data in chunk:
            assert checksum(data) == digest
            out.append((key, bytes(data)))
    assert len(out) == reader.count
    return out


@pytest.fixture
def filled(tmp_path: Path) -> Iterator[tuple[str, list[bytes]]]:
    """A config over an fs root holding 6 blocks of model-a, and their keys."""
    root = tmp_path / "root"
    root.mkdir()
    keys = random_keys(6)
    tier = open_tier(context(model="model-a", slots=64), root, 200)
    try:
        assert store_keys(tier, keys).success
    finally:
        tier.close()
    yield fs_config(tmp_path / "fs.json", str(root), CAP), keys


def _loads_into_a_fresh_tier(tmp_path: Path, url: str, keys: list[bytes]) -> None:
    fresh = tmp_path / f"fresh-{len(list(tmp_path.iterdir()))}"
    fresh.mkdir()
    done = kvtiers("snapshot", "load", fs_config(tmp_path / "fresh.json", str(fresh), CAP),
                   url, "--json")
    assert done.returncode == 0, done.stderr
    tier = open_tier(context(model="model-a"), fresh, 200)
    try:
        assert [tier.lookup(k) for k in keys] == [LookupResult.HIT] * len(keys)
        assert load_and_check(tier, keys).success  # byte for byte
    finally:
        tier.close()


def test_a_directory_of_user_files_is_refused_and_left_intact(
        tmp_path: Path, filled: tuple[str, list[bytes]]) -> None:
    """The issue's reproduction: `mkdir -p victim/sub; echo a > victim/sub/a.txt;
    kvtiers snapshot save fs.json victim --hottest 1` deleted a.txt and exited 0."""
    cfg, _ = filled
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "a.txt").write_text("a\n")
    for more in ([], ["--overwrite"]):
        done = kvtiers("snapshot", "save", cfg, str(victim), "--hottest", "1", *more)
        assert done.returncode == 2, done.stdout + done.stderr
        assert str(victim) in done.stderr and "(sub)" in done.stderr, done.stderr
        assert "not a kvtiers snapshot" in done.stderr and "Traceback" not in done.stderr
        assert _tree(victim) == {"sub/a.txt": b"a\n"}
        assert sorted(os.listdir(tmp_path)) == ["fs.json", "root", "victim"]  # no staging


def test_a_file_a_link_and_a_snapshot_with_user_files_are_refused(
        tmp_path: Path, filled: tuple[str, list[bytes]]) -> None:
    cfg, _ = filled
    snap = tmp_path / "snap"
    assert kvtiers("snapshot", "save", cfg, str(snap)).returncode == 0
    before = _tree(snap)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(snap)
    for target, what in ((notes, "is a file"), (link, "symbolic link")):
        done = kvtiers("snapshot", "save", cfg, str(target), "--overwrite")
        assert done.returncode == 2 and what in done.stderr, done.stderr
    assert notes.read_text() == "mine" and link.is_symlink() and _tree(snap) == before
    # a kvtiers snapshot a user put a file into is no longer kvtiers' alone
    (snap / "README").write_text("my notes on this snapshot")
    done = kvtiers("snapshot", "save", cfg, str(snap), "--overwrite")
    assert done.returncode == 2, done.stderr
    assert "did not write (README)" in done.stderr, done.stderr
    assert _tree(snap) == {**before, "README": b"my notes on this snapshot"}


def test_links_inside_a_snapshot_are_never_followed(tmp_path: Path) -> None:
    """An array or the root metadata swapped for a link: not kvtiers' snapshot any
    more, refused; what the link points to is left as it was."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.bin").write_bytes(os.urandom(1000))
    kept = _tree(mine)
    for entry in ("keys", "zarr.json"):
        url = tmp_path / f"snap-{entry}"
        save(str(url), 1, 2)
        moved = url / entry
        moved.rename(tmp_path / f"aside-{entry}")
        moved.symlink_to(mine if entry == "keys" else mine / "data.bin")
        with pytest.raises(SnapshotError, match="not a kvtiers snapshot|did not write"):
            save(str(url), 2, 2, overwrite=True)
        assert moved.is_symlink() and _tree(mine) == kept


def test_overwrite_replaces_a_snapshot_only_when_asked(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    old_keys, new_keys = random_keys(4), random_keys(7)
    tier = open_tier(context(model="model-a", slots=64), root, 200)
    try:
        assert store_keys(tier, old_keys).success
    finally:
        tier.close()
    cfg = fs_config(tmp_path / "fs.json", str(root), CAP)
    snap = tmp_path / "snaps" / "prompt.zarr"  # its parent is made too
    assert kvtiers("snapshot", "save", cfg, str(snap)).returncode == 0
    before = _tree(snap)
    tier = open_tier(context(model="model-a", slots=64), root, 200)
    try:
        assert store_keys(tier, new_keys).success
    finally:
        tier.close()
    done = kvtiers("snapshot", "save", cfg, str(snap))
    assert done.returncode == 2, done.stderr
    assert "holds a kvtiers snapshot already" in done.stderr and "--overwrite" in done.stderr
    assert _tree(snap) == before
    done = kvtiers("snapshot", "save", cfg, str(snap), "--overwrite", "--json")
    assert done.returncode == 0, done.stderr
    assert {k for k, _ in _content(str(snap))} == set(old_keys + new_keys)
    assert os.listdir(snap.parent) == ["prompt.zarr"]  # nothing left beside it
    _loads_into_a_fresh_tier(tmp_path, str(snap), old_keys + new_keys)


def test_file_urls_save_and_load_and_an_empty_directory_is_kept(
        tmp_path: Path, filled: tuple[str, list[bytes]]) -> None:
    """`file://` failed ("cannot create a snapshot there") after deleting the
    directory; an empty directory is filled in place (its mode kept)."""
    cfg, keys = filled
    for name, make in (("absent", False), ("empty", True)):
        path = tmp_path / name
        if make:
            path.mkdir(mode=0o750)
            path.chmod(0o750)
            inode = path.stat().st_ino
        done = kvtiers("snapshot", "save", cfg, f"file://{path}", "--json")
        assert done.returncode == 0, done.stderr
        assert sorted(os.listdir(path)) == ["blocks", "checksums", "key_lengths", "keys",
                                            "zarr.json"]
        if make:
            assert path.stat().st_ino == inode and (path.stat().st_mode & 0o777) == 0o750
        _loads_into_a_fresh_tier(tmp_path, f"file://{path}", keys)


def test_a_tilde_is_the_home_directory(tmp_path: Path,
                                       filled: tuple[str, list[bytes]]) -> None:
    """`~` (quoted, so no shell expands it) names the home directory, as in a
    `file://` URL - never a directory called `~`; a home with files is refused."""
    cfg, keys = filled
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text("export A=1\n")
    env = dict(os.environ, HOME=str(home))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kvtiers", "snapshot", *args],
                              capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=300)

    for target in ("~", "~/"):
        done = run("save", cfg, target, "--overwrite")
        assert done.returncode == 2 and str(home) in done.stderr, done.stderr
        assert _tree(home) == {".profile": b"export A=1\n"}
    done = run("save", cfg, "~/snaps/a.zarr")
    assert done.returncode == 0, done.stderr
    assert (home / "snaps" / "a.zarr" / "zarr.json").is_file()
    assert not (tmp_path / "~").exists()
    done = run("load", fs_config(tmp_path / "b.json", str(tmp_path / "root"), CAP),
               "~/snaps/a.zarr", "--json")
    assert done.returncode == 0, done.stderr  # the same blocks: stored again, found
    assert {k for k, _ in _content(str(home / "snaps" / "a.zarr"))} == set(keys)


def test_an_empty_mount_point_is_filled_and_a_snapshot_there_is_not_swapped(
        tmp_path: Path, filled: tuple[str, list[bytes]]) -> None:
    """A volume mounted for the snapshot (a container's `-v`): the directory is a
    mount point, which no rename can replace."""
    cfg, keys = filled
    with mounted("tmpfs", tmp_path / "vol", "16m") as vol:
        done = kvtiers("snapshot", "save", cfg, str(vol))
        assert done.returncode == 0, done.stderr
        assert os.path.ismount(vol)
        before = _tree(vol)
        assert {k for k, _ in _content(str(vol))} == set(keys)
        done = kvtiers("snapshot", "save", cfg, str(vol), "--overwrite")
        assert done.returncode == 2 and "mount point" in done.stderr, done.stderr
        assert f"{vol}/NAME" in done.stderr and _tree(vol) == before


def test_a_failure_part_way_leaves_the_old_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtiers.ops import snapshot_target

    url = str(tmp_path / "snap")
    save(url, 1, N)
    old = _tree(Path(url))
    assert [k for k, _ in _content(url)] == [k for k, _ in blocks(1, N)]

    class Injected(Exception):
        pass

    def fail() -> None:
        raise Injected

    with pytest.raises(Injected):  # mid-way: a chunk of the new one written
        save(url, 2, N, overwrite=True, stop=fail)
    assert _tree(Path(url)) == old and os.listdir(tmp_path) == ["snap"]

    def broken(a: str, b: str) -> bool:
        raise OSError(errno.EIO, "injected", b)

    monkeypatch.setattr(snapshot_target, "_exchange", broken)
    with pytest.raises(OSError, match="injected"):  # at the swap itself
        save(url, 2, N, overwrite=True)
    assert _tree(Path(url)) == old and os.listdir(tmp_path) == ["snap"]
    assert _content(url) == blocks(1, N)


def test_a_full_disk_leaves_the_old_snapshot(tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "small", "20m") as small:
        url = str(small / "snap")
        save(url, 1, 16)  # one chunk of rows: 8 MiB
        old = _tree(Path(url))
        with pytest.raises(OSError) as failed:  # three chunks (24 MiB) do not fit
            save(url, 2, N, overwrite=True)
        assert failed.value.errno == errno.ENOSPC
        assert _tree(Path(url)) == old and os.listdir(small) == ["snap"]  # space freed
        assert _content(url) == blocks(1, 16)
        save(url, 3, 20, overwrite=True)  # one chunk fits beside the old one
        assert _content(url) == blocks(3, 20)


@pytest.mark.parametrize("point", ["write", "swap", "swapped"])
def test_a_save_killed_9_leaves_a_whole_snapshot(tmp_path: Path, point: str) -> None:
    """Killed mid-write or just before the swap: the old snapshot, byte for byte;
    just after it: the new one, whole. The next save with --overwrite succeeds."""
    from kvtiers.ops.snapshot_store import rows_per_chunk

    assert 2 * rows_per_chunk(BLOCK_BYTES) < N  # "write" stops after a whole chunk
    url = str(tmp_path / "snap")
    save(url, 1, N)
    old = _tree(Path(url))
    child = subprocess.Popen([sys.executable, "-m", "tests.ops.save_child", url, "2", str(N),
                              point], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=REPO)
    try:
        assert child.stdout is not None
        said = child.stdout.readline().strip()
        assert said == point, child.stderr.read() if child.stderr else ""
    finally:
        child.kill()
        child.communicate(timeout=60)
    assert child.returncode == -9
    left = [n for n in os.listdir(tmp_path) if n != "snap"]
    assert len(left) == 1 and left[0].startswith(".snap.kvtiers-tmp-"), left
    if point == "swapped":
        assert _content(url) == blocks(2, N)
    else:
        assert _tree(Path(url)) == old and _content(url) == blocks(1, N)
    save(url, 3, 5, overwrite=True)
    assert _content(url) == blocks(3, 5)


def test_a_save_killed_9_into_an_empty_directory_is_replaced_with_overwrite(
        tmp_path: Path) -> None:
    """The staging directory left inside marks an incomplete kvtiers snapshot: not
    foreign, replaced with overwrite, the directory kept."""
    target = tmp_path / "empty"
    target.mkdir()
    child = subprocess.Popen([sys.executable, "-m", "tests.ops.save_child", str(target), "2",
                              str(N), "write"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "write"
    finally:
        child.kill()
        child.communicate(timeout=60)
    (staged,) = os.listdir(target)
    assert staged.startswith(".kvtiers-tmp-")
    with pytest.raises(SnapshotError, match="incomplete kvtiers snapshot.*overwrite"):
        save(str(target), 3, 5)
    save(str(target), 3, 5, overwrite=True)
    assert _content(str(target)) == blocks(3, 5)
    assert sorted(os.listdir(target)) == ["blocks", "checksums", "key_lengths", "keys",
                                          "zarr.json"]


def test_memory_urls_follow_the_same_rule() -> None:
    import fsspec

    base = f"/kvtiers-target-test-{os.getpid()}"
    url = f"memory://{base}/snap"
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{base}/mine/notes.txt", b"mine")
    try:
        with pytest.raises(SnapshotError, match="not a kvtiers snapshot"):
            save(f"memory://{base}/mine", 1, 2, overwrite=True)
        assert fs.cat_file(f"{base}/mine/notes.txt") == b"mine"
        save(url, 1, 3)
        with pytest.raises(SnapshotError, match="already"):
            save(url, 2, 3)

        def fail() -> None:
            raise RuntimeError("injected")

        with pytest.raises(RuntimeError):
            save(url, 2, 3, overwrite=True, stop=fail)
        assert _content(url) == blocks(1, 3)
        save(url, 2, 4, overwrite=True)
        assert _content(url) == blocks(2, 4)
        listed = fs.ls(base, detail=False)
        assert sorted(p.rsplit("/", 1)[-1] for p in listed) == ["mine", "snap"]
    finally:
        fs.rm(base, recursive=True)

