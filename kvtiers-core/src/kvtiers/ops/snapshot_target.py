"""Where a snapshot is saved, and the rule that keeps a user's files safe there
(DESIGN.md invariant 7): a path or URL a user names is written only when it is
absent, an empty directory, or a kvtiers snapshot - and a kvtiers snapshot is
replaced only when the caller asked for it (`overwrite`). Anything else - a file,
a symbolic link, a directory with other entries, a snapshot with entries kvtiers
did not write - is refused (`SnapshotTargetError`, naming the path and what it
holds), with or without `overwrite`. A plain path may start with `~` (the home
directory, as in a `file://` URL); `file://` and `local://` URLs are plain paths.

A new snapshot is written whole to a staging directory first and put in place
only once complete (`Staging.commit`, after an fsync of every file it wrote), so a
failure - an exception, a kill -9, a full disk - before that leaves the target as
it was:

- absent target: staged beside it (`.NAME.kvtiers-tmp-XXXX`, same directory), then
  one rename into place.
- empty directory: staged inside it (`.kvtiers-tmp-XXXX`), then its entries are
  moved up, the root `zarr.json` last; the user's directory itself (its owner,
  mode, a mount on it) is kept. Interrupted during those few renames, it holds an
  incomplete snapshot (recognised as one: `overwrite` replaces it).
- a kvtiers snapshot, with `overwrite`: staged beside it (with its permissions),
  then Linux's `renameat2(2)` with `RENAME_EXCHANGE` swaps the two atomically and
  the old one (now at the staging name) is removed; where the filesystem cannot
  exchange, the old one is renamed aside (`.NAME.kvtiers-old-XXXX`), the new one
  renamed in, the old one removed. Readers never see a partial snapshot at the
  path. A snapshot directory that is a mount point cannot be swapped (a rename
  does not cross filesystems): refused before any work, naming a directory inside
  it instead.
- an incomplete kvtiers snapshot, with `overwrite`: staged inside it; its entries
  (all kvtiers', checked again just before) are removed, then the new entries
  moved up as for an empty directory.

A kill -9 leaves at most a staging directory (and, in the window after a swap, the
old snapshot under a `.kvtiers-tmp-`/`.kvtiers-old-` name), safe to delete.

Other fsspec URLs (`s3://`, `memory://`) have no atomic rename of a prefix: the new
snapshot is complete under a sibling prefix before anything of the old one is
deleted; then the old one's root `zarr.json` goes first (it is no longer readable
as a snapshot), the rest of it, and the new one is copied in with its root
`zarr.json` last (readable only once whole), then the sibling is deleted. An
interruption during that leaves the complete new snapshot under the sibling prefix
(loadable by its URL), and the path either without a readable snapshot or with the
new one; a later save with `overwrite` replaces what is left there.

A snapshot is recognised by its root `zarr.json`: a zarr v3 group whose attributes
carry `kvtiers_snapshot` (what `SnapshotWriter` writes), and no entries but its
arrays (`keys`, `key_lengths`, `checksums`, `blocks`, each holding only `zarr.json`
and its chunks `c`) and staging directories (`.kvtiers-tmp-*`). A directory that
holds only those without the root `zarr.json` is an incomplete kvtiers snapshot
(an interrupted save or replace): replaced with `overwrite` like a whole one.

Thread and blocking: all of this is file or object-store I/O on the caller's
thread; nothing here is for the scheduler path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers.ops.snapshot_errors import SnapshotError, describe_error

#: what a snapshot directory holds: its root metadata and its arrays
ARRAYS = frozenset({"keys", "key_lengths", "checksums", "blocks"})
MEMBERS = ARRAYS | {"zarr.json"}
#: what each array directory holds: its metadata and its chunks
ARRAY_MEMBERS = frozenset({"zarr.json", "c"})
TMP_TAG = ".kvtiers-tmp-"
OLD_TAG = ".kvtiers-old-"
#: a root zarr.json larger than this is not ours
MAX_METADATA = 1 << 20
#: how the message of a refused snapshot names the way to replace it, by default
DEFAULT_FLAG = "overwrite=True"


class SnapshotTargetError(SnapshotError):
    """A snapshot target that holds something else than a kvtiers snapshot, or a
    kvtiers snapshot that may not be replaced (no `overwrite`)."""


@dataclass(frozen=True)
class Location:
    """A snapshot's place: `url` as named; `path`, an absolute local path (`fs` is
    None) or the fsspec filesystem's path."""

    url: str
    path: str
    fs: Any = None

    @property
    def local(self) -> bool:
        return self.fs is None

    @property
    def named(self) -> str:
        """`url`, with the local path it resolved to where `url` does not show it
        (`~`, a relative path)."""
        if self.local and not self.url.rstrip("/").endswith(self.path):
            return f"{self.url} ({self.path})"
        return self.url


@dataclass(frozen=True)
class TargetState:
    """What a target holds: `kind` is "absent", "empty", "snapshot" (a whole one),
    "partial" (an incomplete one) or "foreign"; `detail` says what, for messages
    (for "foreign": "is ..." or "holds ...")."""

    kind: str
    detail: str = ""
    #: a local directory that is a mount point (it cannot be swapped by a rename)
    mount: bool = False


def local_path(url: str) -> str | None:
    """The absolute local path `url` names (a plain path, or a `file://` /
    `local://` URL), or None for any other URL."""
    if "://" not in url and "::" not in url:
        return os.path.abspath(os.path.expanduser(url))
    if url.startswith(("file://", "local://")):
        from fsspec.implementations.local import LocalFileSystem

        return os.path.abspath(str(LocalFileSystem._strip_protocol(url)))
    return None


def locate(url: str, storage_options: Mapping[str, Any] | None = None) -> Location:
    """Where `url` points: a local path (plain, `file://`), or an fsspec filesystem
    and its path (`SnapshotError` when fsspec cannot make one)."""
    path = local_path(url)
    if path is not None:
        return Location(url, path)
    try:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        fs, fs_path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except Exception as exc:
        raise SnapshotError(f"{url}: cannot open this URL "
                            f"({describe_error(exc, storage_options)})") from exc
    if isinstance(fs, LocalFileSystem):
        return Location(url, os.path.abspath(fs_path))
    return Location(url, str(fs_path).rstrip("/"), fs)


def same_place(a: str, b: str) -> bool:
    """Whether two URLs name the same snapshot (paths normalised; `file://` and a
    plain path alike; fsspec URLs by protocol and path)."""
    pa, pb = local_path(a), local_path(b)
    if pa is not None or pb is not None:
        return pa is not None and pb is not None and (
            os.path.realpath(pa) == os.path.realpath(pb))
    return a.rstrip("/") == b.rstrip("/")


def _entries(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(sorted(names)[:limit])
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return shown + more


def _count(n: int) -> str:
    return f"{n} {'entry' if n == 1 else 'entries'}"


def _ours(metadata: bytes | None) -> bool:
    """Whether a root zarr.json is a kvtiers snapshot's."""
    if metadata is None or len(metadata) > MAX_METADATA:
        return False
    try:
        doc = json.loads(metadata)
    except ValueError:
        return False
    attrs = doc.get("attributes") if isinstance(doc, dict) else None
    return (doc.get("zarr_format") == 3 and doc.get("node_type") == "group"
            and isinstance(attrs, dict) and isinstance(attrs.get("kvtiers_snapshot"), int))


def _classify(loc: Location, names: list[str], metadata: bytes | None,
              array_entries: dict[str, list[str] | None]) -> TargetState:
    """A non-empty directory: a whole or incomplete kvtiers snapshot, or foreign.
    `array_entries`: what each array directory holds (None: not a directory)."""
    staged = [n for n in names if n.startswith(TMP_TAG)]
    others = [n for n in names if n not in MEMBERS and n not in staged]
    odd = [f"{a}/{e}" for a, held in array_entries.items()
           for e in (held if held is not None else ["(not a directory)"])
           if e not in ARRAY_MEMBERS]
    whole = "zarr.json" in names and _ours(metadata)
    looks = not others and not odd
    if whole and looks:
        return TargetState("snapshot", "a kvtiers snapshot")
    if "zarr.json" not in names and looks:
        return TargetState("partial", "an incomplete kvtiers snapshot (no zarr.json: an "
                           "interrupted save or replace)")
    if whole:
        return TargetState("foreign", f"holds a kvtiers snapshot and "
                           f"{_count(len(others + odd))} kvtiers did not write "
                           f"({_entries(others + odd)})")
    return TargetState("foreign", f"holds {_count(len(names))} that "
                       f"{'is' if len(names) == 1 else 'are'} not a kvtiers snapshot "
                       f"({_entries(names)})")


def _local_listing(path: str) -> list[str] | None:
    """The entries of a real directory (not a link), or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    return os.listdir(path)


def inspect_target(loc: Location, ignore: str = "") -> TargetState:
    """What `loc` holds now, not counting an entry named `ignore` (a save's own
    staging directory) (`SnapshotError` when it cannot be read)."""
    try:
        return _inspect_local(loc, ignore) if loc.local else _inspect_remote(loc)
    except SnapshotError:
        raise
    except Exception as exc:
        raise SnapshotError(f"{loc.named}: cannot tell what is there "
                            f"({describe_error(exc, None)})") from exc


def _inspect_local(loc: Location, ignore: str = "") -> TargetState:
    try:
        st = os.lstat(loc.path)
    except FileNotFoundError:
        return TargetState("absent")
    if stat.S_ISLNK(st.st_mode):
        return TargetState("foreign", "is a symbolic link (kvtiers follows none: name the "
                           "directory itself)")
    if not stat.S_ISDIR(st.st_mode):
        return TargetState("foreign", "is a file, not a directory")
    names = [n for n in os.listdir(loc.path) if n != ignore]
    if not names:
        return TargetState("empty")
    metadata = None
    meta_path = os.path.join(loc.path, "zarr.json")
    with contextlib.suppress(OSError):
        mst = os.lstat(meta_path)
        if stat.S_ISREG(mst.st_mode) and mst.st_size <= MAX_METADATA:
            with open(meta_path, "rb") as f:
                metadata = f.read(MAX_METADATA + 1)
    arrays = {a: _local_listing(os.path.join(loc.path, a)) for a in names if a in ARRAYS}
    state = _classify(loc, names, metadata, arrays)
    if state.kind == "snapshot" and os.path.ismount(loc.path):
        return TargetState(state.kind, state.detail, mount=True)
    return state


def _inspect_remote(loc: Location) -> TargetState:
    fs = loc.fs
    with contextlib.suppress(Exception):
        fs.invalidate_cache(loc.path)
    try:
        info = fs.info(loc.path)
    except FileNotFoundError:
        return TargetState("absent")
    if info.get("type") != "directory":
        return TargetState("foreign", "is a file (an object), not a directory")
    names = _remote_names(fs, loc.path)
    if not names:
        return TargetState("empty")
    metadata = None
    if "zarr.json" in names:
        with contextlib.suppress(FileNotFoundError):
            metadata = fs.cat_file(f"{loc.path}/zarr.json")
    arrays: dict[str, list[str] | None] = {}
    for a in names:
        if a in ARRAYS:
            try:
                sub = f"{loc.path}/{a}"
                arrays[a] = (_remote_names(fs, sub)
                             if fs.info(sub).get("type") == "directory" else None)
            except FileNotFoundError:
                arrays[a] = None
    return _classify(loc, names, metadata, arrays)


def _remote_names(fs: Any, path: str) -> list[str]:
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)
    try:
        listed = fs.ls(path, detail=False)
    except FileNotFoundError:
        return []
    names = {str(p).rstrip("/").rsplit("/", 1)[-1] for p in listed}
    names.discard("")
    base = path.rstrip("/").rsplit("/", 1)[-1]
    if len(listed) == 1 and str(listed[0]).rstrip("/") == path.rstrip("/"):
        names.discard(base)  # a file listed as itself
    return sorted(names)


def refusal(loc: Location, state: TargetState, *, overwrite: bool,
            flag: str = DEFAULT_FLAG) -> str | None:
    """Why a snapshot may not be saved at `loc` as it is now, or None."""
    if state.kind == "foreign":
        return (f"{loc.named}: refusing to save a snapshot there: it {state.detail}; "
                "kvtiers replaces only an empty directory or a kvtiers snapshot "
                "(name a new or empty directory)")
    if state.kind in ("snapshot", "partial") and not overwrite:
        return (f"{loc.named}: holds {state.detail} already; refusing to replace it "
                f"without {flag}")
    if state.kind == "snapshot" and state.mount:
        return (f"{loc.named}: holds {state.detail}, and is a mount point: kvtiers replaces "
                "a snapshot by swapping a complete new one in with a rename, which cannot "
                f"cross filesystems; save to a directory inside it ({loc.url.rstrip('/')}"
                "/NAME)")
    return None


def check_target(url: str, storage_options: Mapping[str, Any] | None = None, *,
                 overwrite: bool = False, flag: str = DEFAULT_FLAG) -> TargetState:
    """What `url` holds, when a snapshot may be saved there (`overwrite`: an
    existing kvtiers snapshot may be replaced); else `SnapshotTargetError` naming
    the path, what it holds, and `flag` where that would allow it."""
    loc = locate(url, storage_options)
    state = inspect_target(loc)
    why = refusal(loc, state, overwrite=overwrite, flag=flag)
    if why is not None:
        raise SnapshotTargetError(why)
    return state


#: the name `kvtiers.ops` gives `check_target`
check_snapshot_target = check_target


def _split(loc: Location) -> tuple[str, str]:
    sep = os.sep if loc.local else "/"
    parent, found, name = loc.path.rstrip(sep).rpartition(sep)
    if not found or not name or name in (".", ".."):
        raise SnapshotTargetError(f"{loc.named}: names no directory to save a snapshot in "
                                  "(a snapshot needs a path below a directory or bucket)")
    return (parent or sep), name


#: renameat2(2) flags
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def _renameat2(a: str, b: str, flags: int) -> bool:
    """Linux `renameat2(a, b, flags)`; False where the call or the flag is not
    available (then nothing was done); OSError for any other failure."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                   ctypes.c_uint]
    fn.restype = ctypes.c_int
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically; False where the filesystem cannot."""
    return _renameat2(a, b, RENAME_EXCHANGE)


def _rename_new(a: str, b: str) -> None:
    """Rename `a` to `b`, which must not exist (FileExistsError): never replaces
    what appeared at `b` meanwhile, an empty directory included."""
    if _renameat2(a, b, RENAME_NOREPLACE):
        return
    if os.path.lexists(b):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), b)
    os.rename(a, b)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    """Every file and directory under `root` on stable storage (a power loss after
    the swap finds the new snapshot whole, not empty files under its names)."""
    for here, _, files in os.walk(root, topdown=False):
        for name in files:
            _fsync_path(os.path.join(here, name))
        _fsync_path(here)


def _remove(path: str) -> None:
    """A file or a whole directory (never following a link)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _mkdir_unique(parent: str, prefix: str) -> str:
    """A new directory `parent/prefix<random>` (mode 0777 less the umask, as zarr
    makes its own directories)."""
    path = os.path.join(parent, f"{prefix}{uuid.uuid4().hex[:16]}")
    os.mkdir(path, 0o777)
    return path


class Staging:
    """A new snapshot's staging location (`zarr_store`), put in place of the target
    by `commit` once complete, or removed by `abort` (see the module docstring for
    where it is and how it is put in place). The target is checked when made
    (`SnapshotTargetError`) and again just before the swap. One thread at a time;
    `commit` and `abort` block on the store's I/O."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 overwrite: bool = False, flag: str = DEFAULT_FLAG):
        self.loc = locate(url, storage_options)
        self.overwrite, self.flag = overwrite, flag
        self.storage_options = storage_options
        self._ignore = ""
        state = self._check()
        parent, name = _split(self.loc)
        self._prefix = f".{name[:96]}"
        #: staged inside the target itself (empty, or an incomplete snapshot: nothing
        #: there to keep whole), not beside it
        self.inside = self.loc.local and state.kind in ("empty", "partial")
        if self.inside:
            self.tmp = _mkdir_unique(self.loc.path, TMP_TAG)
            self._ignore = os.path.basename(self.tmp)
        elif self.loc.local:
            os.makedirs(parent, exist_ok=True)
            self.tmp = _mkdir_unique(parent, self._prefix + TMP_TAG)
        else:
            self.tmp = f"{parent.rstrip('/')}/{self._prefix}{TMP_TAG}{uuid.uuid4().hex[:16]}"
            with contextlib.suppress(Exception):
                self.loc.fs.makedirs(self.tmp, exist_ok=True)
        self.done = False

    def _check(self) -> TargetState:
        state = inspect_target(self.loc, self._ignore)
        why = refusal(self.loc, state, overwrite=self.overwrite, flag=self.flag)
        if why is not None:
            raise SnapshotTargetError(why)
        return state

    def zarr_store(self) -> Any:
        """What `zarr.open_group` takes for the staging location."""
        if self.loc.local:
            return self.tmp
        from zarr.storage import FsspecStore

        return FsspecStore.from_mapper(self.loc.fs.get_mapper(self.tmp))

    def abort(self) -> None:
        """Remove the staging directory (only it: the target is left as it was)."""
        if self.done:
            return
        self.done = True
        if self.loc.local:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            with contextlib.suppress(Exception):
                self.loc.fs.rm(self.tmp, recursive=True)

    def commit(self) -> None:
        """Put the complete new snapshot in place of the target (checked again)."""
        if not self.loc.local:
            self._commit_remote(self._check())
            self.done = True
            return
        try:
            _fsync_tree(self.tmp)
            self._commit_local(self._check())
        except BaseException:
            self.abort()
            raise
        self.done = True

    def _changed(self) -> SnapshotTargetError:
        return SnapshotTargetError(
            f"{self.loc.named}: something was written there while the snapshot was saved; "
            "refusing to replace it")

    def _commit_local(self, state: TargetState) -> None:
        path = self.loc.path
        parent, _ = _split(self.loc)
        if state.kind == "absent" and not self.inside:
            try:
                _rename_new(self.tmp, path)
            except FileExistsError as exc:
                raise self._changed() from exc
            _fsync_path(parent)
            return
        if state.kind == "empty" or (state.kind == "partial" and self.inside):
            if state.kind == "partial":  # its entries are kvtiers' (checked just now)
                for name in os.listdir(path):
                    if name != self._ignore:
                        _remove(os.path.join(path, name))
            self._move_up(path)
            return
        if self.inside or state.kind != "snapshot":
            raise self._changed()
        os.chmod(self.tmp, stat.S_IMODE(os.lstat(path).st_mode))  # the old one's mode
        if _exchange(self.tmp, path):
            shutil.rmtree(self.tmp, ignore_errors=True)  # the old snapshot, swapped out
            _fsync_path(parent)
            return
        old = _mkdir_unique(parent, self._prefix + OLD_TAG)
        try:
            os.rename(path, old)  # over the empty directory just made
        except BaseException:
            os.rmdir(old)
            raise
        try:
            os.rename(self.tmp, path)
        except BaseException:
            os.rename(old, path)
            raise
        _fsync_path(parent)
        shutil.rmtree(old, ignore_errors=True)

    def _move_up(self, path: str) -> None:
        """The staged entries into the empty directory `path`, its root `zarr.json`
        last (readable as a snapshot only once whole); then the staging directory
        goes."""
        names = sorted(os.listdir(self.tmp), key=lambda n: (n == "zarr.json", n))
        for name in names:
            try:
                _rename_new(os.path.join(self.tmp, name), os.path.join(path, name))
            except FileExistsError as exc:
                raise self._changed() from exc
        _fsync_path(path)
        if self.inside:
            os.rmdir(self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _commit_remote(self, state: TargetState) -> None:
        fs, path, tmp = self.loc.fs, self.loc.path, self.tmp
        # From here the sibling is the one whole new snapshot: never removed on failure.
        self.done = True
        if state.kind in ("snapshot", "partial"):
            old = [str(p) for p in fs.find(path)]
            root = f"{path}/zarr.json"
            if root in old:  # first: the old one is no longer readable as a snapshot
                fs.rm_file(root)
                old.remove(root)
            if old:
                fs.rm(old)
        new = sorted(str(p) for p in fs.find(tmp))
        root_new = f"{tmp}/zarr.json"
        rest = [p for p in new if p != root_new]
        if rest:
            fs.copy(rest, [path + p[len(tmp):] for p in rest])
        fs.copy(root_new, f"{path}/zarr.json")  # last: readable only once whole
        with contextlib.suppress(Exception):
            fs.rm(tmp, recursive=True)


__all__ = ["Location", "SnapshotTargetError", "Staging", "TargetState",
           "check_snapshot_target", "check_target", "inspect_target", "local_path", "locate",
           "same_place"]
