"""A network namespace with only its own loopback, for everything Mooncake runs.

Mooncake's clients listen on every interface (their handshake and TCP transfer
ports bind 0.0.0.0 whatever `local_hostname` says), so the tests keep every
Mooncake process and client inside a namespace of their own: nothing outside it
can reach them, and nothing they do leaves it.

- processes (masters, engine children) start with `ip netns exec` (`command`);
- an in-process tier is built inside `entered()`: the calling thread switches to
  the namespace (`setns`, per thread) while the tier's constructor starts its
  threads and Mooncake's, which stay there; the thread then switches back;
- `run(fn)` calls `fn` on a thread that lives in the namespace (raw clients,
  HTTP requests to the master's admin port).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def available() -> str | None:
    """Why a namespace cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (Mooncake's clients listen on 0.0.0.0)"
    return None


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


class NetNamespace:
    def __init__(self) -> None:
        self.name = f"kvt-mc-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True,
                       timeout=30)
        try:
            subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True,
                           capture_output=True, timeout=30)
            self._worker = ThreadPoolExecutor(1, thread_name_prefix=self.name,
                                              initializer=self._enter)
        except BaseException:
            self.delete()
            raise

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def _enter(self) -> None:
        _setns(self.path)

    def command(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *args]

    @contextmanager
    def entered(self) -> Iterator[None]:
        """The calling thread in the namespace for the block (threads it starts stay)."""
        root = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(self.path)
            try:
                yield
            finally:
                if _libc.setns(root, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to the root namespace")
        finally:
            os.close(root)

    def run(self, fn: Callable[..., T], *args: object, timeout: float = 60.0) -> T:
        return self._worker.submit(fn, *args).result(timeout)

    def free_port(self) -> int:
        def pick() -> int:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return int(s.getsockname()[1])
        return self.run(pick)

    def delete(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.shutdown(wait=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
