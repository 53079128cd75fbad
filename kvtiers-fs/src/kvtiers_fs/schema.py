"""The `fs` tier's config schema, vLLM's names for its options, and the checks a
schema cannot express (is the root directory there, and writable?).

Imported by the plugin module, so it imports no tier code: `kvtiers plugins` and
`kvtiers validate` stay fast.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from typing import Any

from kvtiers.errors import ConfigNote, ConfigProblem

from kvtiers_fs.namespaces import list_namespaces

DEFAULT_THREADS = {"load": 8, "store": 8}

_THREADS = {
    "type": "integer",
    "minimum": 1,
    "maximum": 256,
}

FS_SCHEMA: Mapping[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "fs tier",
    "type": "object",
    "additionalProperties": False,
    "required": ["root_dir", "capacity_bytes"],
    "properties": {
        "root_dir": {
            "oneOf": [
                {"type": "string", "pattern": "^/", "minLength": 2},
                {
                    "type": "array",
                    "items": {"type": "string", "pattern": "^/", "minLength": 2},
                    "minItems": 1,
                    "uniqueItems": True,
                },
            ],
            "description": (
                "An existing directory (absolute path), or a list of them - e.g. one per "
                "NVMe drive; blocks are spread over them by key hash, so every process "
                "sharing them must list the same directories in the same order. The "
                "directory itself must not be a symlink. Each model gets its own "
                "sub-directory (its namespace fingerprint)."
            ),
        },
        "capacity_bytes": {
            "type": "integer",
            "minimum": 1,
            "description": (
                "Bytes this model's blocks may take on EACH root directory, counted as "
                "files on disk (a 4 KiB header plus the block rounded up to 4 KiB), "
                "whichever processes write them; every process sharing a root should "
                "use the same value."
            ),
        },
        "eviction_policy": {
            "type": "string",
            "minLength": 1,
            "x-kvtiers": "policy",
            "default": "lru",
            "description": "name of a registered eviction policy (see `kvtiers plugins`)",
        },
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
    return [r for r in roots or () if isinstance(r, str)]


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


def check_machine(options: Mapping[str, Any]) -> list[ConfigProblem | ConfigNote]:
    """The tier record's machine check (`kvtiers validate`): `check_options`, plus a
    `ConfigNote` for each namespace (model) already on a usable root."""
    problems: list[ConfigProblem | ConfigNote] = [*check_options(options)]
    bad = {p.path for p in problems}
    for path, root in _roots_with_paths(options):
        if path in bad:
            continue
        try:
            found = list_namespaces(root)
        except OSError:
            continue
        problems += [ConfigNote(path, f"fs tier: {root} holds namespace {ns} ({ns.path}); "
                                      "each model uses only its own")
                     for ns in found]
    return problems


def _roots_with_paths(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    many = not isinstance(options.get("root_dir"), str)
    return [(f"$.root_dir[{i}]" if many else "$.root_dir", root)
            for i, root in enumerate(root_dirs(options))]


def check_root(root: str) -> str | None:
    """Why `root` cannot be a root directory, or None."""
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
        why = {errno.EACCES: "permission denied", errno.EPERM: "not permitted",
               errno.EROFS: "read-only filesystem", errno.ENOSPC: "no space left"}
        return f"{root!r} is not writable ({why.get(exc.errno or 0, exc.strerror)})"
    os.close(fd)
    os.unlink(name)
    return None
