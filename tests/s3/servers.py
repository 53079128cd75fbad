"""Real S3 servers on loopback for tests and benches: moto (server mode, its own
process), SeaweedFS (`weed mini`) and rclone (`serve s3`), each started on free
ports in a private directory, waited for until a PUT/GET/DELETE round trip works,
and stopped (SIGKILL if it does not stop at once) with its directory removed.

    with start_server("seaweedfs", tmp_dir) as server:
        fs = s3fs.S3FileSystem(**server.storage_options())
        ...
        server.kill(); server.start()      # an outage: same ports, same data dir

Nothing here talks to anything but 127.0.0.1. SeaweedFS has its telemetry turned
off and every one of its ports (and the gRPC twins) given explicitly, so several
instances run side by side. Imports no kvtiers code.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
KINDS = ("moto", "seaweedfs", "rclone")
START_TIMEOUT_S = 60.0  # a restarted weed sometimes waits ~15 s for its volume server

# botocore >= 1.36 sends and checks CRC checksums by default; servers other than AWS
# do not all support that (ranged GETs in particular). See ENVIRONMENT.md.
BOTOCORE_CONFIG: dict[str, Any] = {
    "request_checksum_calculation": "when_required",
    "response_checksum_validation": "when_required",
}


@dataclass(frozen=True)
class Identity:
    """Access key and secret of one user of a server (the secret never in repr)."""

    key: str
    secret: str = field(repr=False)


def free_port(pair_offset: int = 0) -> int:
    """A TCP port on 127.0.0.1 that is free now; with `pair_offset`, one whose
    `port + pair_offset` twin is free too (SeaweedFS' admin gRPC port is always
    its HTTP port + 10000, whatever it is told)."""
    for _ in range(200):
        port = random.randint(20000, 29999) if pair_offset else _bind_any()
        if all(_is_free(p) for p in {port, port + pair_offset}):
            return port
    raise RuntimeError("no free pair of loopback ports found")


def _bind_any() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class S3Server(ABC):
    """One server process over `root` (its data and log live there). `start`
    waits until the server stores and serves an object; `kill` is SIGKILL (an
    outage); `start` after `kill` comes back on the same port with the same data
    (moto's data is in memory: it comes back empty, with `bucket` re-created)."""

    kind: str = ""
    bucket = "kvtiers-test"

    def __init__(self, root: Path):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.admin = Identity("AKIDKVTIERSADMIN0001", "kvtiers-admin-secret-" + uuid.uuid4().hex)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    def environment(self) -> dict[str, str]:
        return {**os.environ}

    def after_start(self) -> None:
        """Create `bucket` where the server does not do it itself."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou,
                                 client.exceptions.BucketAlreadyExists):
            client.create_bucket(Bucket=self.bucket)

    # -- clients ----------------------------------------------------------------

    def storage_options(self, identity: Identity | None = None) -> dict[str, Any]:
        """fsspec/s3fs options for this server."""
        who = identity or self.admin
        return {
            "key": who.key,
            "secret": who.secret,
            "endpoint_url": self.endpoint_url,
            "config_kwargs": dict(BOTOCORE_CONFIG),
        }

    def client(self, identity: Identity | None = None) -> Any:
        """A boto3 S3 client for this server (a new one each call: a test may kill
        and restart the server, and a kept client's pooled connections would be
        the dead server's)."""
        import boto3
        from botocore.config import Config

        who = identity or self.admin
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=who.key,
            aws_secret_access_key=who.secret,
            region_name="us-east-1",
            config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 1},
                          **BOTOCORE_CONFIG),
        )

    # -- process ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        if self.running:
            return
        self._log = open(self.root / "server.log", "ab")  # noqa: SIM115 - closed in _reap
        self.proc = subprocess.Popen(
            self.command(), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=self.root, env=self.environment(),
            start_new_session=True,
        )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the server and reap it (an outage; `start` brings it back)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        """Kill the server and remove its directory."""
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def _reap(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            if _accepts(self.port):
                try:
                    self.after_start()
                    self._round_trip()
                    return
                except Exception as exc:  # noqa: BLE001 - not ready yet, whatever it says
                    last = exc
            time.sleep(0.05)
        raise TimeoutError(f"{self.kind} not ready after {timeout} s (last error: {last!r}):\n"
                           f"{self.log_tail()}")

    def _round_trip(self) -> None:
        client = self.client()
        name = f".ready-{uuid.uuid4().hex}"
        body = os.urandom(64)
        client.put_object(Bucket=self.bucket, Key=name, Body=body)
        got = client.get_object(Bucket=self.bucket, Key=name)["Body"].read()
        client.delete_object(Bucket=self.bucket, Key=name)
        if got != body:
            raise RuntimeError(f"{self.kind} returned other bytes than it stored")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return (self.root / "server.log").read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    # -- between tests -------------------------------------------------------------

    def clear(self, prefix: str = "", bucket: str | None = None) -> None:
        """Delete every object under `prefix` in `bucket` (default: the server's)."""
        client = self.client()
        bucket = bucket or self.bucket
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            if keys:  # a page is at most 1000 keys: what one DeleteObjects takes
                done = client.delete_objects(Bucket=bucket,
                                             Delete={"Objects": keys, "Quiet": True})
                if done.get("Errors"):
                    raise RuntimeError(f"{self.kind} did not delete: {done['Errors'][:3]}")

    def clear_bucket(self, bucket: str) -> None:
        """Empty and delete `bucket`."""
        self.clear(bucket=bucket)
        self.client().delete_bucket(Bucket=bucket)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class MotoServer(S3Server):
    """moto in server mode, in its own process (several times faster than
    in-process `ThreadedMotoServer`, which shares the tests' GIL). Accepts any
    credentials; its state is in memory."""

    kind = "moto"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def environment(self) -> dict[str, str]:
        # moto must never try to reach AWS, nor read a developer's credentials.
        return {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


class SeaweedServer(S3Server):
    """`weed mini` (master, volume, filer, S3 gateway in one process). Identities
    come from an S3 config file: `admin` (everything) and `reader` (read and list
    only, for permission tests)."""

    kind = "seaweedfs"

    def __init__(self, root: Path):
        super().__init__(root)
        self.reader = Identity("AKIDKVTIERSREADER01", "kvtiers-reader-secret-" + uuid.uuid4().hex)
        # weed's worker always dials the admin's HTTP port + 10000 for gRPC.
        admin = free_port(pair_offset=10000)
        self.ports = {
            "s3.port": self.port, "s3.port.grpc": free_port(),
            "filer.port": free_port(), "filer.port.grpc": free_port(),
            "master.port": free_port(), "master.port.grpc": free_port(),
            "volume.port": free_port(), "volume.port.grpc": free_port(),
            "admin.port": admin, "admin.port.grpc": admin + 10000,
            "s3.port.iceberg": 0, "s3.port.lance": 0,
        }
        config = {"identities": [
            {"name": "admin", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
             "credentials": [{"accessKey": self.admin.key, "secretKey": self.admin.secret}]},
            {"name": "reader", "actions": ["Read", "List"],
             "credentials": [{"accessKey": self.reader.key, "secretKey": self.reader.secret}]},
        ]}
        (root / "s3.json").write_text(json.dumps(config))

    def command(self) -> list[str]:
        data = self.root / "data"
        data.mkdir(exist_ok=True)
        return [
            str(BIN / "weed"), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-admin.ui=false", "-webdav=false", "-master.telemetry=false",
            f"-bucket={self.bucket}", f"-s3.config={self.root / 's3.json'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]

    def after_start(self) -> None:
        pass  # `-bucket` creates it


class RcloneServer(S3Server):
    """`rclone serve s3` over a local directory: a bucket is a sub-directory."""

    kind = "rclone"

    def command(self) -> list[str]:
        data = self.root / "data"
        (data / self.bucket).mkdir(parents=True, exist_ok=True)
        return [str(BIN / "rclone"), "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
                "--auth-key", f"{self.admin.key},{self.admin.secret}", str(data)]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "RCLONE_CONFIG": str(self.root / "rclone.conf")}

    def after_start(self) -> None:
        pass  # the directory is the bucket


_CLASSES: dict[str, type[S3Server]] = {
    "moto": MotoServer, "seaweedfs": SeaweedServer, "rclone": RcloneServer,
}


def make_server(kind: str, root: Path) -> S3Server:
    """A server of `kind` (one of `KINDS`) over `root`, not started yet."""
    return _CLASSES[kind](root)


@contextlib.contextmanager
def start_server(kind: str, root: Path) -> Iterator[S3Server]:
    """A started server, stopped and removed at the end, also on failure."""
    server = make_server(kind, root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
