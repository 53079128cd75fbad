"""`Master`: a real `mooncake_master` in a test's network namespace, without a
metadata server (clients use P2PHANDSHAKE), on free ports; started, killed (-9)
and started again on the same ports by the tests."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from kvtiers_mooncake import admin
from kvtiers_mooncake.client import close_connections

from tests.mooncake.netns import NetNamespace

BINARY = shutil.which("mooncake_master") or str(Path(sys.executable).parent / "mooncake_master")


class Master:
    def __init__(self, ns: NetNamespace, log_dir: Path, *, lease_ms: int | None = None,
                 extra_args: Sequence[str] = ()):
        self.ns = ns
        self.extra_args = list(extra_args)
        self.rpc_port = ns.free_port()
        self.admin_port = ns.free_port()
        self.log_dir = log_dir
        self.lease_ms = lease_ms
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def admin_address(self) -> str:
        return f"127.0.0.1:{self.admin_port}"

    def start(self) -> None:
        args = [BINARY, "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc_port}",
                "--enable_http_metadata_server=false", "--metrics_host=127.0.0.1",
                f"--metrics_port={self.admin_port}", "--rpc_thread_num=2"]
        if self.lease_ms is not None:
            args.append(f"--default_kv_lease_ttl={self.lease_ms}")
        args += self.extra_args

        self.starts += 1
        log = open(self.log_dir / f"master-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(self.ns.command(*args), stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                self.ns.run(admin.master_view, self.admin_address, 1.0)
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mooncake_master did not start; see {log.name}") \
                        from None
                time.sleep(0.05)

    def kill(self) -> None:
        """kill -9, reaped."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def freeze(self) -> None:
        """SIGSTOP: the process stays, its sockets stay open, nothing answers."""
        assert self.proc is not None and self.proc.poll() is None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after `freeze`."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen master cannot act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def stop_with_clients(self) -> None:
        """Close this process's idle connections to the master while it still
        answers (Mooncake's close unmounts their segments there), then stop it."""
        if self.proc is not None and self.proc.poll() is None:
            close_connections(self.address)
        self.stop()

    def names(self) -> list[str]:
        """Every object name the master holds (its admin listing)."""
        return self.ns.run(admin.all_keys, self.admin_address, 5.0)

    def view(self) -> admin.MasterView:
        return self.ns.run(admin.master_view, self.admin_address, 5.0)

    def metrics_text(self) -> str:
        def get() -> str:
            url = f"http://{self.admin_address}/metrics"
            with urllib.request.urlopen(url, timeout=5) as reply:
                return str(reply.read().decode())
        return self.ns.run(get)
