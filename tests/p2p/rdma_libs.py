"""The host's RDMA libraries as Debian ships them (`libibverbs1`, `ibverbs-providers`:
libibverbs, the providers, libefa), for child processes of the tests, without
installing them machine-wide.

Where the host has them (`libefa.so.1` loads) a child needs nothing more. Else
the packages (and the libnl ones they link) are fetched once with
`apt-get download` into a directory of this user's under the temporary
directory and unpacked there (`dpkg -x`); a child finds them through
`LD_LIBRARY_PATH`. Where neither works (no apt, no network) `rdma_environment`
says why, for a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["PACKAGES", "rdma_environment"]

PACKAGES = ("libibverbs1", "ibverbs-providers", "libnl-3-200", "libnl-route-3-200")
_CACHE = Path(tempfile.gettempdir()) / f"kvtiers-tests-rdma-libs-{os.getuid()}"
_LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu",
             "lib/aarch64-linux-gnu")


def loads(library: str, env: dict[str, str]) -> bool:
    """Whether `library` loads (dlopen) in a fresh process with `env`."""
    probe = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({library!r})"],
                           env=env, capture_output=True, timeout=60)
    return probe.returncode == 0


def _unpacked() -> Path:
    """The packages unpacked under `_CACHE` (fetched the first time); RuntimeError
    saying why they cannot be."""
    done = _CACHE / "root"
    if done.is_dir():
        return done
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise RuntimeError("no apt-get/dpkg here to fetch " + ", ".join(PACKAGES))
    _CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=_CACHE))  # ours alone until renamed into place
    try:
        got = subprocess.run(["apt-get", "download", *PACKAGES], cwd=work,
                             capture_output=True, text=True, timeout=300)
        debs = sorted(work.glob("*.deb"))
        if got.returncode != 0 or len(debs) != len(PACKAGES):
            raise RuntimeError(f"apt-get download {' '.join(PACKAGES)} failed: "
                               f"{(got.stderr or got.stdout).strip()[-500:]}")
        for deb in debs:
            subprocess.run(["dpkg", "-x", str(deb), str(work / "root")], check=True,
                           capture_output=True, timeout=120)
        try:
            (work / "root").rename(done)
        except OSError:  # another run put its copy there first
            if not done.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done


def rdma_environment(env: dict[str, str]) -> tuple[dict[str, str] | None, str]:
    """`env` for a child that loads the host's RDMA libraries, and where they come
    from ("the host's" or the unpacked directory); (None, why) where there are none
    to be had."""
    if loads("libefa.so.1", env):
        return dict(env), "the host's"
    try:
        root = _unpacked()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return None, f"no RDMA libraries here and none to fetch: {exc}"
    dirs = [str(root / d) for d in _LIB_DIRS if (root / d).is_dir()]
    old = env.get("LD_LIBRARY_PATH")
    child = {**env, "LD_LIBRARY_PATH": os.pathsep.join([*dirs, *([old] if old else [])])}
    if not loads("libefa.so.1", child):
        return None, f"libefa.so.1 does not load from {', '.join(dirs)}"
    return child, str(root)
