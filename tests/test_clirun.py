"""tests/clirun.py: a `kvtiers` command line forked from the warm server gives what a
real `python -m kvtiers` gives - exit status, stdout, stderr, stdin, working
directory, environment - and falls back to a real one where a fork could differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import clirun
from tests.clirun import REPO, run_kvtiers


def _real(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtiers", *argv], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def _forked(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    done = run_kvtiers(argv, **kw)  # type: ignore[arg-type]
    server = clirun._server
    assert server is not None and server.ok, "the server did not start single-threaded"
    return done


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["no-such-command"],
                                  ["validate", str(REPO / "examples" / "config.json")],
                                  ["validate", str(REPO / "no" / "such.json")]])
def test_a_forked_run_says_and_exits_as_a_real_one(argv: list[str]) -> None:
    forked, real = _forked(argv), _real(argv)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (real.returncode, real.stdout, real.stderr)


def test_stdin_cwd_and_environment_reach_the_run(tmp_path: Path) -> None:
    doc = json.loads((REPO / "examples" / "config.json").read_text())
    (tmp_path / "here.json").write_text(json.dumps(doc))
    # a relative path resolves in the run's cwd; the config comes on stdin too
    forked = _forked(["validate", "--json", "here.json"], cwd=tmp_path)
    assert forked.returncode == 0, forked.stderr
    piped = _forked(["validate", "--json", "-"], input=json.dumps(doc))
    assert piped.returncode == 0 and json.loads(piped.stdout) == json.loads(forked.stdout)
    # what the run's environment says is what it sees (COLUMNS: read at run time)
    narrow = _forked(["--help"], env={**os.environ, "COLUMNS": "40"})
    wide = _forked(["--help"], env={**os.environ, "COLUMNS": "200"})
    assert max(map(len, narrow.stdout.splitlines())) <= 40 < \
        max(map(len, wide.stdout.splitlines()))


def test_an_environment_a_fork_cannot_give_runs_a_real_process() -> None:
    _forked(["--version"])
    server = clirun._server
    assert server is not None
    env = {**server.env, "FSSPEC_S3_KEY": "read-at-import"}
    assert not server.fits(env)
    assert not server.fits({**server.env, "KVTIERS_PURE_PYTHON": "1"})
    assert not server.fits({**server.env, "PYTHONPATH": "/no/such/dir"})
    assert server.fits({**server.env, "AWS_ACCESS_KEY_ID": "read-per-session"})
    assert _forked(["--version"], env=env).stdout == _real(["--version"]).stdout


def test_a_run_past_its_timeout_is_killed(tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_kvtiers(["bench", "--model", "tiny", "--sessions", "100000", "--no-progress",
                     "--tmp-dir", str(tmp_path)], timeout=0.5)
    assert _forked(["--version"]).returncode == 0  # the server serves on
