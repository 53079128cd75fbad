"""Where a snapshot is saved, and the rule that keeps a user's files safe there
(DESIGN.md invariant 7): a path or URL a user names is written only when it is
absent, an empty directory, or a kvtiers snapshot - and a kvtiers snapshot is
replaced only when the caller asked for it (`overwrite`). Anything else - a file,
a symbolic link, a directory with other entries, a snapshot with entries kvtiers
did not write - is refused (`SnapshotTargetError`, naming the path and what it
holds), with or without `overwrite`.

A new snapshot is written whole to a sibling first (`.NAME.kvtiers-tmp-XXXX`, in
the same directory or prefix) and only then put in place (`Staging.commit`):

- local paths (and `file://` URLs, the same thing): one rename. Into an absent or
  empty directory `rename(2)`; over an old snapshot Linux's `renameat2(2)` with
  `RENAME_EXCHANGE` swaps the two atomically, then the old one (now at the
  sibling's name) is removed; where the filesystem cannot exchange, the old one is
  renamed aside (`.NAME.kvtiers-old-XXXX`), the new one renamed in, the old one
  removed. A failure or a kill -9 at any instant before the swap leaves the old
  snapshot as it was (and at most a `.NAME.kvtiers-tmp-*` sibling, safe to delete);
  readers never see a partial snapshot at the path.
- other fsspec URLs (`s3://`, `memory://`), which have no atomic rename of a
  prefix: the new snapshot is complete under the sibling prefix before anything of
  the old one is deleted; then the old one's root `zarr.json` goes first (it is no
  longer readable as a snapshot), the rest of it, and the new one is copied in with
  its root `zarr.json` last (readable only once whole), then the sibling is
  deleted. An interruption during that leaves the complete new snapshot under the
  sibling prefix (loadable by its URL), and the path either without a readable
  snapshot or with the new one; a later save with `overwrite` replaces what is
  left there (an incomplete kvtiers snapshot is recognised as one).

A snapshot is recognised by its root `zarr.json`: a zarr v3 group whose attributes
carry `kvtiers_snapshot` (what `SnapshotWriter` writes), and no entries but its
arrays (`keys`, `key_lengths`, `checksums`, `blocks`, each holding only `zarr.json`
and its chunks `c`). A directory that holds only those arrays without the root
`zarr.json` is an incomplete kvtiers snapshot (an interrupted replace): replaced
with `overwrite` like a whole one.
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
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers.ops.snapshot_store import SnapshotError, describe_error

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


@dataclass(frozen=True)
class TargetState:
    """What a target holds: `kind` is "absent", "empty", "snapshot" (a whole one),
    "partial" (an incomplete one) or "foreign"; `detail` says what, for messages
    (for "foreign": "is ..." or "holds ...")."""

    kind: str
    detail: str = ""


def local_path(url: str) -> str | None:
    """The absolute local path `url` names (a plain path, or a `file://` /
    `local://` URL), or None for any other URL."""
    if "://" not in url and "::" not in url:
        return os.path.abspath(url)
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
    others = [n for n in names if n not in MEMBERS]
    odd = [f"{a}/{e}" for a, held in array_entries.items()
           for e in (held if held is not None else ["(not a directory)"])
           if e not in ARRAY_MEMBERS]
    whole = "zarr.json" in names and _ours(metadata)
    looks = not others and not odd and bool(array_entries)
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


def inspect_target(loc: Location) -> TargetState:
    """What `loc` holds now (`SnapshotError` when it cannot be read)."""
    try:
        return _inspect_local(loc) if loc.local else _inspect_remote(loc)
    except SnapshotError:
        raise
    except Exception as exc:
        raise SnapshotError(f"{loc.url}: cannot tell what is there "
                            f"({describe_error(exc, None)})") from exc


def _inspect_local(loc: Location) -> TargetState:
    try:
        st = os.lstat(loc.path)
    except FileNotFoundError:
        return TargetState("absent")
    if stat.S_ISLNK(st.st_mode):
        return TargetState("foreign", "is a symbolic link (kvtiers follows none: name the "
                           "directory itself)")
    if not stat.S_ISDIR(st.st_mode):
        return TargetState("foreign", "is a file, not a directory")
    names = os.listdir(loc.path)
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
    return _classify(loc, names, metadata, arrays)


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
        return (f"{loc.url}: refusing to save a snapshot there: it {state.detail}; "
                "kvtiers replaces only an empty directory or a kvtiers snapshot "
                "(name a new or empty directory)")
    if state.kind in ("snapshot", "partial") and not overwrite:
        return (f"{loc.url}: holds {state.detail} already; refusing to replace it "
                f"without {flag}")
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
    parent, _, name = loc.path.rstrip(sep).rpartition(sep)
    if not name or name in (".", ".."):
        raise SnapshotTargetError(f"{loc.url}: names no directory to save a snapshot in "
                                  "(a snapshot needs a path below a directory or bucket)")
    return (parent or sep), name


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux `renameat2` with `RENAME_EXCHANGE`); False
    where that is not available (then nothing was done)."""
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
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


class Staging:
    """A new snapshot's sibling location (`zarr_store`), put in place of the target
    by `commit` once complete, or removed by `abort`. The target is checked when
    made (`SnapshotTargetError`) and again just before the swap."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 overwrite: bool = False, flag: str = DEFAULT_FLAG):
        self.loc = locate(url, storage_options)
        self.overwrite, self.flag = overwrite, flag
        self.storage_options = storage_options
        self._check()
        parent, name = _split(self.loc)
        self._prefix = f".{name[:96]}"
        if self.loc.local:
            os.makedirs(parent, exist_ok=True)
            self.tmp = tempfile.mkdtemp(prefix=self._prefix + TMP_TAG, dir=parent)
        else:
            self.tmp = f"{parent.rstrip('/')}/{self._prefix}{TMP_TAG}{uuid.uuid4().hex[:16]}"
            with contextlib.suppress(Exception):
                self.loc.fs.makedirs(self.tmp, exist_ok=True)
        self.done = False

    def _check(self) -> TargetState:
        state = inspect_target(self.loc)
        why = refusal(self.loc, state, overwrite=self.overwrite, flag=self.flag)
        if why is not None:
            raise SnapshotTargetError(why)
        return state

    def zarr_store(self) -> Any:
        """What `zarr.open_group` takes for the sibling location."""
        if self.loc.local:
            return self.tmp
        from zarr.storage import FsspecStore

        return FsspecStore.from_mapper(self.loc.fs.get_mapper(self.tmp))

    def abort(self) -> None:
        """Remove the sibling (only it: the target is left as it was)."""
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
        try:
            state = self._check()
        except BaseException:
            self.abort()
            raise
        if self.loc.local:
            try:
                self._commit_local(state)
            except BaseException:
                self.abort()
                raise
        else:
            self._commit_remote(state)
        self.done = True

    def _commit_local(self, state: TargetState) -> None:
        path = self.loc.path
        if state.kind in ("absent", "empty"):
            try:
                os.rename(self.tmp, path)  # an empty directory is replaced, no other
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise SnapshotTargetError(
                        f"{self.loc.url}: something was written there while the snapshot "
                        "was saved; refusing to replace it") from exc
                raise
            return
        if _exchange(self.tmp, path):
            shutil.rmtree(self.tmp, ignore_errors=True)  # the old snapshot, swapped out
            return
        parent, _ = _split(self.loc)
        old = tempfile.mkdtemp(prefix=self._prefix + OLD_TAG, dir=parent)
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
        shutil.rmtree(old, ignore_errors=True)

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
