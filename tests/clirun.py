"""`python -m kvtiers ARGS` for the tests, as a user runs it - a process of its
own, with its own exit status, stdout, stderr, working directory and environment -
without paying Python's start-up and the CLI's imports on every run (~0.3 s bare,
~1 s once s3fs and botocore load, per command line).

A server process (`python -m tests.clirun MODULE...`, one per test session, started
on first use) imports the CLI's modules once and stays single-threaded; each run is
a child forked from it that takes the run's cwd, environment and argv, runs
`kvtiers.cli.main` as `python -m kvtiers` does (atexit handlers included) and exits
with its status. What a fork cannot give falls back to a real `python -m kvtiers`:
an environment that differs from the server's in a variable read at start-up or
import (`_AT_IMPORT`: fsspec reads its `FSSPEC_*` as it loads), or a PYTHONPATH
entry the server's `sys.path` lacks (a test hiding or adding distributions).
KVTIERS_TEST_CLI_SUBPROCESS=1 makes every run a real one.

    done = run_kvtiers(["inspect", cfg, "--json"], cwd=REPO, timeout=300)
    done.returncode, done.stdout, done.stderr     # a subprocess.CompletedProcess
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: what the server imports before it forks (each one when importable)
#: (not zarr: it starts a native thread at import, and a fork would lose it)
PRELOAD = ("kvtiers.cli", "kvtiers.config", "kvtiers.manager", "kvtiers.ops", "kvtiers.bench",
           "kvtiers_fs.tier", "kvtiers_s3.tier", "s3fs")
#: environment variables that the interpreter or a preloaded module reads at start-up
#: or import: a run whose environment differs from the server's in one of them is a
#: real process (PYTHONPATH: see `fits`). Any other variable is read by the run itself
#: (botocore's AWS_* as it builds a session, the terminal size as output is formatted,
#: UCX's and NIXL's as they load - the server loads neither), so the tests' process may
#: gain some (torch sets TORCHINDUCTOR_CACHE_DIR) without costing every later run.
_AT_IMPORT = frozenset({"HOME", "LANG", "LANGUAGE", "TMPDIR", "TEMP", "TMP"})
_AT_IMPORT_PREFIXES = ("PYTHON", "KVTIERS_", "FSSPEC_", "S3FS_", "LC_", "AIOHTTP_", "YARL_",
                       "MULTIDICT_", "PROPCACHE_", "FROZENLIST_")


class _Server:
    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.clirun", *PRELOAD],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=REPO, env=self.env)
        self._pending = b""  # what was read of the server's replies past the last line
        hello = self._read(120)
        self.path: list[str] = hello["path"] if hello.get("ok") else []
        self.ok = bool(hello.get("ok"))

    def _read(self, timeout: float) -> dict[str, Any]:
        """The server's next reply line (TimeoutError if none within `timeout`). Read
        with os.read and a buffer of its own: a buffered reader may hold a line that
        select() on the pipe would never report."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + timeout
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError("the kvtiers CLI server exited")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        doc: dict[str, Any] = json.loads(line)
        return doc

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a fork of the server runs as a new process with `env` would."""
        keys = {k for k in set(env) | set(self.env) if k != "PYTHONPATH"
                and (k in _AT_IMPORT or k.startswith(_AT_IMPORT_PREFIXES))}
        if any(env.get(k) != self.env.get(k) for k in keys):
            return False
        return all(p in self.path for p in _pythonpath(env))

    def run(self, argv: Sequence[str], cwd: str, env: Mapping[str, str], timeout: float,
            input: str | None) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None
        with tempfile.TemporaryDirectory(prefix="kvtiers-cli-") as tmp:
            out, err, into = (os.path.join(tmp, name) for name in ("out", "err", "in"))
            Path(into).write_text(input or "")
            request = {"argv": list(argv), "cwd": cwd, "env": dict(env), "in": into,
                       "out": out, "err": err}
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            pid = int(self._read(60)["pid"])
            try:
                status = int(self._read(timeout)["status"])
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._read(60)
                raise subprocess.TimeoutExpired(["kvtiers", *argv], timeout) from None
            return subprocess.CompletedProcess(
                [sys.executable, "-m", "kvtiers", *argv], status,
                Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace"))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


_lock = threading.Lock()
_server: _Server | None = None


def run_kvtiers(argv: Sequence[str], *, cwd: str | Path = REPO,
                env: Mapping[str, str] | None = None, timeout: float = 300,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m kvtiers *argv` in `cwd` with `env` (default: this process's) and
    `input` on its stdin (else an empty one), its output captured as text: what
    `subprocess.run(..., capture_output=True, text=True)` returns (TimeoutExpired
    after `timeout`, the run killed)."""
    global _server
    env = dict(os.environ if env is None else env)
    with _lock:
        if not os.environ.get("KVTIERS_TEST_CLI_SUBPROCESS"):
            if _server is None:
                _server = _Server()
                atexit.register(_server.close)
            if _server.ok and _server.fits(env):
                return _server.run(argv, str(cwd), env, timeout, input)
    return subprocess.run([sys.executable, "-m", "kvtiers", *argv], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=timeout,
                          input="" if input is None else input)


# -- the server ----------------------------------------------------------------------


def _child(request: dict[str, Any], base_path: list[str]) -> None:
    """In the forked child: become `python -m kvtiers ARGV` and exit with its status
    (`base_path`: the server's sys.path without its working directory and PYTHONPATH)."""
    status = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        # what `python -m` starts with: the working directory, PYTHONPATH, the rest
        first = [os.getcwd(), *_pythonpath(request["env"])]
        sys.path[:] = [*first, *(p for p in base_path if p not in first)]  # as site does
        os.environ.clear()
        os.environ.update(request["env"])
        source = os.open(request["in"], os.O_RDONLY)
        os.dup2(source, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        os.close(source)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin
        import kvtiers

        sys.argv = [str(Path(kvtiers.__file__).with_name("__main__.py")), *request["argv"]]
        from kvtiers.cli import main

        try:
            status = main(request["argv"])
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                status = 1
    except BaseException:  # noqa: BLE001 - what the interpreter does with it, then exit
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status & 0xFF)


def _pythonpath(env: Mapping[str, str]) -> list[str]:
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _threads() -> int:
    """This process's threads, native ones included (Linux), else Python's."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _serve(preload: Sequence[str]) -> None:
    import importlib

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not installed here: imported per run
            continue
    own = set(_pythonpath(os.environ))
    base_path = [p for p in sys.path[1:] if os.path.abspath(p) not in own]
    reply = sys.stdout
    single = _threads() == 1  # forking a threaded process is unsafe
    hello = {"ok": single, "path": [os.path.abspath(p) for p in sys.path if p]}
    reply.write(json.dumps(hello) + "\n")
    reply.flush()
    if not single:
        return
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            sys.stdin.close()
            _child(request, base_path)
        reply.write(json.dumps({"pid": pid}) + "\n")
        reply.flush()
        _, wait_status = os.waitpid(pid, 0)
        reply.write(json.dumps({"status": os.waitstatus_to_exitcode(wait_status)}) + "\n")
        reply.flush()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the session's Ctrl-C is for pytest
    _serve(sys.argv[1:])
