from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.p2p.engine import Engine

ROOT = Path(__file__).resolve().parents[2]


def _entry_point_dir() -> str | None:
    """Where a child finds kvtiers-p2p's entry point when the distribution is not
    installed (tests run from the sources): a dist-info of its own, made once."""
    try:
        md.distribution("kvtiers-p2p")
        return None
    except md.PackageNotFoundError:
        pass
    where = Path(tempfile.gettempdir()) / f"kvtiers-p2p-tests-{os.getuid()}"
    info = where / "kvtiers_p2p-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvtiers-p2p\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[kvtiers]\np2p = kvtiers_p2p.plugin\n")
    return str(where)


def child_env() -> dict[str, str]:
    """The environment of a child process: this checkout's sources first (and the
    p2p tier's entry point, when it is not installed)."""
    paths = [str(ROOT / d / "src") for d in ("kvtiers-core", "kvtiers-fs", "kvtiers-p2p")]
    paths.append(str(ROOT))
    extra = _entry_point_dir()
    if extra is not None:
        paths.append(extra)
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *([old] if old else [])])}


class Peer:
    """A serving engine in a child process (`tests.p2p.peer`)."""

    def __init__(self, spec: dict[str, Any], prefix: list[str] | None = None):
        self._err = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "tests.p2p.peer", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
            env=child_env(), cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer exited with {self.proc.wait(30)} before serving")
        self.endpoint: str = json.loads(line)["endpoint"]

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def log(self) -> str:
        """What the child wrote to stderr so far (its warnings)."""
        self._err.seek(0)
        return self._err.read()

    def kill(self) -> None:
        """kill -9, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def stop(self) -> None:
        """A clean exit: stdin closes, the engine closes."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


StartPeer = Callable[..., Peer]
MakeEngine = Callable[..., Engine]


@pytest.fixture
def peers() -> Iterator[StartPeer]:
    """Start serving engines in child processes; all killed at the end of the test."""
    started: list[Peer] = []

    def start(spec: dict[str, Any], prefix: list[str] | None = None) -> Peer:
        peer = Peer(spec, prefix)
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()


@pytest.fixture
def engines() -> Iterator[MakeEngine]:
    """In-process engines, closed at the end of the test."""
    made: list[Engine] = []

    def make(config: dict[str, Any], **kw: Any) -> Engine:
        engine = Engine(config, **kw)
        made.append(engine)
        return engine

    yield make
    for engine in reversed(made):
        engine.close()
