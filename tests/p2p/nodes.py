"""`kvtiers serve` cache nodes in processes of their own, for the tests."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.p2p.conftest import ROOT, child_env
from tests.p2p.engine import BB, MODEL


def geometry(block_bytes: int) -> list[str]:
    """`kvtiers serve`'s geometry arguments for `make_namespace(block_bytes=...)`."""
    return ["--layers", "1", "--kv-heads", "1", "--head-size", str(block_bytes // 2),
            "--dtype", "uint8", "--tokens-per-block", "1"]


class Node:
    """`kvtiers serve --config CONFIG` started and waited for (its ready file), with
    `env` as its environment (`child_env()` when None)."""

    def __init__(self, config: dict[str, Any], tmp: Path, *args: str, model: str = MODEL,
                 block_bytes: int = BB, env: dict[str, str] | None = None):
        self.ready = tmp / f"ready-{time.monotonic_ns()}.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvtiers", "serve", "--config", json.dumps(config),
             "--model", model, *geometry(block_bytes), "--ready-file", str(self.ready),
             "--status-every", "0.2", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=child_env() if env is None else env, cwd=ROOT)
        end = time.monotonic() + 60
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                self.proc.kill()
                _, err = self.proc.communicate(timeout=30)
                raise AssertionError(f"the node did not start: {err[-3000:]}")
            time.sleep(0.02)
        self.endpoint: str = json.loads(self.ready.read_text())["endpoints"][0]

    def terminate(self) -> tuple[int, str, str]:
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=60)
