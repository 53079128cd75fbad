"""The `fs` tier's config schema, vLLM's names for its options, and the checks a
schema cannot express (is the root directory there and writable, does the capacity
fit its filesystem?), and the capacity a vLLM config leaves out, derived from the
filesystem.

Imported by the plugin module, so it imports no tier code: `kvtiers plugins` and
`kvtiers validate` stay fast.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Mapping
from typing import Any

from kvtiers.errors import ConfigError, ConfigNote, ConfigProblem
from kvtiers.plugins import CAPACITY_BYTES, DRAFT, EVICTION_POLICY, THREADS
from kvtiers.sdk import format_bytes

from kvtiers_fs import overhead
from kvtiers_fs.namespace.listing import list_namespaces

try:  # kvtiers-core 0.2 says warnings apart from notes; an older core gets notes
    from kvtiers.errors import ConfigWarning
except ImportError:  # pragma: no cover - depends on the installed core
    ConfigWarning = ConfigNote  # type: ignore[misc,assignment]

DEFAULT_THREADS = {"load": 8, "store": 8}

# the core's fragment, with the fs tier's own bound
_THREADS = {**THREADS, "maximum": 256}

_ABSOLUTE = {
    "type": "string",
    "pattern": "^/[^\\x00]*$",
    "title": "an absolute path",
}

# vLLM's fs tier has no capacity (it never evicts); kvtiers keeps every tier bounded.
CAPACITY_SHARE = 0.9

FS_SCHEMA: Mapping[str, Any] = {
    "$schema": DRAFT,
    "title": "fs tier",
    "type": "object",
    "additionalProperties": False,
    "required": ["root_dir", "capacity_bytes"],
    "properties": {
        "root_dir": {
            "oneOf": [
                _ABSOLUTE,
                {
                    "type": "array",
                    "items": _ABSOLUTE,
                    "minItems": 1,
                    "uniqueItems": True,
                    "title": "a non-empty array of absolute paths",
                },
            ],
            "x-kvtiers": "own_directory",
            "description": (
                "An existing directory (absolute path), or a list of them - e.g. one per "
                "NVMe drive; blocks are spread over them by key hash, so every process "
                "sharing them must list the same directories in the same order. The "
                "directory itself must not be a symlink. Each model gets its own "
                "sub-directory (its namespace fingerprint)."
            ),
        },
        "capacity_bytes": {
            **CAPACITY_BYTES,
            "x-kvtiers-derive": {
                "function": "kvtiers_fs.schema:derive_capacity",
                "rule": (
                    f"{CAPACITY_SHARE:.0%} of the space free on each root's filesystem "
                    "(plus what kvtiers blocks already hold there), never more than "
                    "its size"
                ),
            },
            "description": (
                "Bytes this model's blocks may take on EACH root directory, counted as "
                "files on disk (a 4 KiB header plus the block rounded up to 4 KiB), "
                "whichever processes write them; every process sharing a root should "
                "use the same value. Must fit the root's filesystem. Required, except "
                "in a vLLM kv_transfer_config (vLLM's fs tier has no such key): there "
                f"it defaults to {CAPACITY_SHARE:.0%} of the space free on the root's "
                "filesystem when the config is loaded, and `kvtiers validate` says how "
                "much."
            ),
        },
        "eviction_policy": {**EVICTION_POLICY},
        "threads": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "load": {**_THREADS, "default": DEFAULT_THREADS["load"],
                         "description": "threads that prefer loads (vLLM: n_read_threads)"},
                "store": {**_THREADS, "default": DEFAULT_THREADS["store"],
                          "description": "threads that prefer stores (vLLM: n_write_threads)"},
            },
            "default": dict(DEFAULT_THREADS),
            "description": (
                "I/O threads per kind; an idle thread of one kind takes the other kind's "
                "work, and loads never queue behind stores on a load thread"
            ),
        },
        "o_direct": {
            "enum": ["auto", True, False],
            "default": "auto",
            "description": (
                '"auto": O_DIRECT where the filesystem supports it (probed at start), '
                "buffered I/O elsewhere; true: require it (an error where unsupported); "
                "false: always buffered (reads may then come from the page cache)"
            ),
        },
        "shared": {
            "type": "boolean",
            "default": True,
            "description": (
                "other processes (ranks, engines on a shared filesystem) may write these "
                "roots: a lookup of a block this process has not seen starts a probe of "
                "the journal and answers RETRY. false: this process is the only writer, "
                "so its index is the whole truth and such a lookup is a MISS at once "
                "(no scheduler step spent waiting)"
            ),
        },
        "durable": {
            "type": "boolean",
            "default": False,
            "description": (
                "fsync each block file, its directory and the journal before a store "
                "reports success: blocks survive a power loss, at a cost (see "
                "docs/benchmarks.md). Off, a crash of the process (kill -9) still loses "
                "nothing that was reported stored."
            ),
        },
    },
}

#: vLLM's fs tier option names -> ours (applied to vLLM kv_transfer_configs only)
VLLM_ALIASES: Mapping[str, str] = {
    "n_read_threads": "threads.load",
    "n_write_threads": "threads.store",
}


def root_dirs(options: Mapping[str, Any]) -> list[str]:
    roots = options.get("root_dir")
    if isinstance(roots, str):
        return [roots]
    if isinstance(roots, (list, tuple)):
        return [r for r in roots if isinstance(r, str)]
    return []


Remark = ConfigProblem | ConfigNote | ConfigWarning


def check_options(options: Mapping[str, Any]) -> list[ConfigProblem]:
    """Problems with the filesystem the options name, as `ConfigProblem`s whose paths
    start at the section (`$.root_dir[1]`). Checks each root: absolute, an existing
    directory, not a symlink, and writable - tried for real, by creating and removing
    a temporary file, since `access(2)` says yes to root on a read-only mount."""
    problems: list[ConfigProblem] = []
    for path, root in _roots_with_paths(options):
        message = check_root(root)
        if message:
            problems.append(ConfigProblem(path, f"fs tier: {message}"))
    return problems


def check_machine(options: Mapping[str, Any]) -> list[Remark]:
    """The tier record's machine check (`kvtiers validate`): `check_options`; the
    capacity against each filesystem (more than its size: a problem; more than it
    has free: a warning); a `ConfigNote` for each namespace (model) already on a
    usable root."""
    problems: list[Remark] = [*check_options(options)]
    bad = {p.path for p in problems}
    usable = [(path, root) for path, root in _roots_with_paths(options) if path not in bad]
    for path, root in usable:
        try:
            found = list_namespaces(root)
        except OSError:
            continue
        problems += [ConfigNote(path, f"fs tier: {root} holds namespace {ns} ({ns.path}); "
                                      "each model uses only its own")
                     for ns in found]
        if _on_tmpfs(root):
            problems.append(ConfigWarning(
                path, f"fs tier: {root} is on a memory filesystem (tmpfs): its blocks "
                "take RAM, up to capacity_bytes, on top of the CPU pool"))
    capacity = options.get("capacity_bytes")
    if isinstance(capacity, int) and not isinstance(capacity, bool):
        problems += _check_capacity(capacity, [root for _, root in usable])
    return problems


def derive_capacity(options: Mapping[str, Any]) -> tuple[int, str]:
    """`capacity_bytes` for a vLLM config, which has none: CAPACITY_SHARE of the
    space free on each root's filesystem now, counting the bytes kvtiers blocks
    already hold there as free (a restart must not shrink the bound to what the
    last run left over), never more than the filesystem's size, divided among the
    roots on one filesystem; the smallest over the roots, whole MiB."""
    roots = root_dirs(options)
    unusable = [r for r in roots if check_root(r)]
    if unusable or not roots:
        raise ConfigError(ConfigProblem(
            "$.capacity_bytes",
            "not set (vLLM's fs tier has no such key), and kvtiers derives it from the "
            "root's filesystem, which cannot be used (see root_dir); set capacity_bytes"))
    per_root: list[tuple[int, _Space]] = []
    for space in _spaces(roots):
        budget = min(space.size, int(CAPACITY_SHARE * (space.free + space.held)))
        # ... and room for the tier's own metadata beside it, on small filesystems
        fits = largest_capacity(min(space.size, space.free + space.held), len(space.roots),
                                space.dir_block)
        per_root.append((min(budget // len(space.roots), fits), space))
    if not per_root:
        raise ConfigError(ConfigProblem(
            "$.capacity_bytes",
            "not set (vLLM's fs tier has no such key), and the root's filesystem cannot "
            "be examined to derive it; set capacity_bytes"))
    capacity, space = min(per_root, key=lambda item: item[0])
    capacity -= capacity % (1 << 20)
    if space.size == 0:
        raise ConfigError(ConfigProblem(
            "$.capacity_bytes",
            f"not set (vLLM's fs tier has no such key), and the filesystem of "
            f"{space.roots[0]} reports no size (ramfs?) to derive it from; set "
            "capacity_bytes"))
    if capacity < 1 << 20:
        raise ConfigError(ConfigProblem(
            "$.capacity_bytes",
            f"not set (vLLM's fs tier has no such key), and {space.roots[0]} has only "
            f"{format_bytes(space.free)} free: too little to derive a capacity from; free "
            "space there or set capacity_bytes"))
    shared = f", shared by {len(space.roots)} roots" if len(space.roots) > 1 else ""
    held = f" plus {format_bytes(space.held)} of kvtiers blocks" if space.held else ""
    return capacity, (
        f"not set (vLLM's fs tier has no such key): {format_bytes(capacity)} ({capacity} "
        f"bytes) per root, {CAPACITY_SHARE:.0%} of the {format_bytes(space.free)} free"
        f"{held} on the filesystem of {space.roots[0]} (size {format_bytes(space.size)}"
        f"{shared}); set capacity_bytes to choose the bound yourself"
    )


class _Space:
    """One filesystem under some of the roots: its size, what is free, what kvtiers
    blocks already hold on those roots."""

    def __init__(self, roots: list[str], size: int, free: int, held: int, dir_block: int):
        self.roots = roots
        self.size = size
        self.free = free
        self.held = held
        self.dir_block = dir_block  # 0 where directories take no space (tmpfs)


def _spaces(roots: list[str]) -> list[_Space]:
    by_device: dict[int, _Space] = {}
    for root in roots:
        try:
            st = os.statvfs(root)
            device = os.stat(root).st_dev
        except OSError:
            continue
        held = 0
        with contextlib.suppress(OSError):
            held = sum(ns.bytes or 0 for ns in list_namespaces(root))
        space = by_device.get(device)
        if space is None:
            by_device[device] = _Space([root], st.f_blocks * st.f_frsize,
                                       st.f_bavail * st.f_frsize, held,
                                       0 if _on_tmpfs(root) else st.f_bsize)
        else:
            space.roots.append(root)
            space.held += held
    return list(by_device.values())


def largest_capacity(space: int, roots: int, dir_block: int) -> int:
    """The largest `capacity_bytes` (whole 64 KiB) for which `roots` roots, each with
    its blocks and its metadata (`overhead.metadata_bytes`), fit in `space` bytes."""
    def fits(c: int) -> bool:
        return roots * (c + overhead.metadata_bytes(c, dir_block=dir_block)) <= space

    lo, hi = 0, max(0, space // roots) >> 16
    while lo < hi:  # the metadata grows with the capacity: bisect
        mid = (lo + hi + 1) // 2
        if fits(mid << 16):
            lo = mid
        else:
            hi = mid - 1
    return lo << 16


def _check_capacity(capacity: int, roots: list[str]) -> list[Remark]:
    out: list[Remark] = []
    for space in _spaces(roots):
        if space.size == 0:  # ramfs and friends report no size: nothing to compare
            continue
        n = len(space.roots)
        meta = overhead.metadata_bytes(capacity, dir_block=space.dir_block)
        want = (capacity + meta) * n
        what = (f"{format_bytes(capacity)} per root for {n} roots on one filesystem"
                if n > 1 else format_bytes(capacity))
        what += (f" plus up to {format_bytes(meta)}{' each' if n > 1 else ''} of the tier's "
                 f"own index ({_META_PARTS if space.dir_block else _META_PARTS_TMPFS})")
        where = f"the filesystem of {space.roots[0]}"
        if want > space.size:
            best = largest_capacity(space.size, n, space.dir_block)
            out.append(ConfigProblem("$.capacity_bytes", (
                f"fs tier: {what} is more than {where} holds ({format_bytes(space.size)}, "
                f"{format_bytes(space.free)} free now); "
                + (f"set capacity_bytes to at most {format_bytes(best)} ({best} bytes), less "
                   "what other files need" if best else
                   "this filesystem is too small for an fs tier; give a root on a larger one"))))
        elif want > space.free + space.held:
            held = f" plus {format_bytes(space.held)} of kvtiers blocks" if space.held else ""
            out.append(ConfigWarning("$.capacity_bytes", (
                f"fs tier: {what} is more than {where} has free now "
                f"({format_bytes(space.free)}{held}, of {format_bytes(space.size)}): "
                "stores will fail for lack of space before the tier reaches its capacity "
                "and evicts; free space there or lower capacity_bytes")))
    return out


def room_warnings(roots: list[str], capacity: int, file_bytes: int) -> list[str]:
    """What a tier opening with these roots says when `capacity` per root and the
    index's room for blocks files of `file_bytes` (`overhead.metadata_bytes`) do not
    fit a root's filesystem: a config `kvtiers validate` refused, or a filesystem
    that shrank. One stat per root."""
    by_device: dict[int, list[str]] = {}
    for root in roots:
        with contextlib.suppress(OSError):
            by_device.setdefault(os.stat(root).st_dev, []).append(root)
    out = []
    for same in by_device.values():
        try:
            st = os.statvfs(same[0])
        except OSError:
            continue
        size, dir_block = st.f_blocks * st.f_frsize, 0 if _on_tmpfs(same[0]) else st.f_bsize
        meta = overhead.metadata_bytes(capacity, file_bytes, dir_block)
        if size and len(same) * (capacity + meta) > size:
            out.append(
                f"capacity_bytes {format_bytes(capacity)} per root plus up to "
                f"{format_bytes(meta)} of the tier's own index is more than the filesystem of "
                f"{same[0]} holds ({format_bytes(size)}, {len(same)} root(s) on it): stores "
                "will fail for lack of space before the tier evicts; lower capacity_bytes")
    return out


_META_PARTS = "journals, snapshots, directories"
_META_PARTS_TMPFS = "journals, snapshots"


def _on_tmpfs(root: str) -> bool:
    """True when `root` lies on tmpfs or ramfs (the longest mount point above it in
    /proc/self/mountinfo)."""
    try:
        real = os.path.realpath(root)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    best, kind = "", ""
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = fields[4].replace("\\040", " ")  # mountinfo escapes spaces
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, tail[0]
    return kind in ("tmpfs", "ramfs")


def _no_storage(root: str) -> bool:
    try:
        return os.statvfs(root).f_blocks == 0
    except OSError:
        return False


def _roots_with_paths(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    many = not isinstance(options.get("root_dir"), str)
    return [(f"$.root_dir[{i}]" if many else "$.root_dir", root)
            for i, root in enumerate(root_dirs(options))]


_WHY = {errno.EACCES: "permission denied", errno.EPERM: "not permitted",
        errno.EROFS: "read-only filesystem", errno.ENOSPC: "no space left"}


def check_root(root: str) -> str | None:
    """Why `root` cannot be a root directory, or None."""
    if "\x00" in root:
        return f"{root!r} contains a NUL character, which no path can hold"
    if not os.path.isabs(root):
        return f"{root!r} is a relative path; give an absolute one"
    if os.path.islink(root):
        return f"{root!r} is a symlink; the tier never follows symlinks - give the real path"
    if not os.path.exists(root):
        return f"{root!r} does not exist; create it (the tier does not create its root)"
    if not os.path.isdir(root):
        return f"{root!r} is not a directory"
    name = os.path.join(root, f".kvtiers-fs-check.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        why = _WHY.get(exc.errno or 0)
        if why is None and _no_storage(root):
            return (f"{root!r} is on a virtual filesystem (such as /proc or /sys), which "
                    "holds no files; give a directory on a disk")
        if why is None:
            return (f"{root!r} does not accept new files ({exc.strerror}); give a directory "
                    "on a writable disk filesystem")
        return f"{root!r} is not writable ({why})"
    os.close(fd)
    os.unlink(name)
    return None
