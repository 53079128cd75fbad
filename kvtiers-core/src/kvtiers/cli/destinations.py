"""Files a command will write at its end (`kvtiers bench --json OUT --plot OUT.png`),
checked before the work starts: a bad path should fail in a second with a sentence,
not after a minute of work with raw errno text.

The check creates nothing where the file goes (a refused run leaves no file behind):
it writes and removes a temporary file in the nearest directory that exists, the
one the command would create the missing ones in.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from kvtiers.errors import KvtiersError


class DestinationError(KvtiersError):
    """A file a command would write at its end cannot be written."""


_WHY = {
    errno.EACCES: "permission denied",
    errno.EPERM: "not permitted",
    errno.EROFS: "a read-only filesystem",
    errno.ENOSPC: "no space left",
    errno.ENAMETOOLONG: "the name is too long",
}


def _why(exc: OSError) -> str:
    return _WHY.get(exc.errno or 0, exc.strerror or str(exc))


def check_writable(path: Path, flag: str) -> None:
    """Raise `DestinationError` unless `path` can be written as a file, creating
    missing parent directories as the command will."""
    shown = str(path)
    if "\x00" in shown:
        raise DestinationError(f"{flag} {shown!r}: a path cannot hold a NUL character")
    if not shown.strip():
        raise DestinationError(f"{flag}: give a file name")
    if path.is_dir():
        raise DestinationError(f"{flag} {shown}: is a directory; give a file name in it")
    parent = path.parent
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise DestinationError(
            f"{flag} {shown}: {str(parent)!r} is a file, so no directory can be made there"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".kvtiers-write-check.", dir=parent)
    except OSError as exc:
        raise DestinationError(f"{flag} {shown}: cannot write in {parent} ({_why(exc)})") from None
    os.close(fd)
    os.unlink(probe)
    if path.exists():
        try:
            with open(path, "ab"):
                pass  # appends nothing: the file is untouched until the end
        except OSError as exc:
            raise DestinationError(f"{flag} {shown}: cannot be overwritten ({_why(exc)})") from None


def check_plot_destination(path: Path) -> None:
    """`--plot OUT`: matplotlib is there, OUT's suffix is a format it writes, and
    OUT can be written."""
    from kvtiers.bench.plot import PlotUnavailable, supported_formats

    try:
        formats = supported_formats()
    except PlotUnavailable as exc:
        raise DestinationError(str(exc)) from None
    check_writable(path, "--plot")
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in formats:
        raise DestinationError(
            f"--plot {path}: "
            + (f"{path.suffix!r} is not an image format" if suffix else "has no suffix")
            + f"; matplotlib writes {', '.join('.' + f for f in formats)} (e.g. out.png)"
        )
