"""Upgrading (or downgrading) vLLM keeps the fs tier's contents: blocks one supported
vLLM minor stored are hits, byte for byte, for an engine on another, at either level.

The other vLLM is of another supported minor: `make`'s `.venv/vllm-0.34` (vLLM 0.34
alone, run on PYTHONPATH over this environment), this environment's own vLLM when
this process runs on that one, or another virtual environment at the repository
root; its engine runs in a subprocess (tests/vllm/upgrade_writer.py) on the same
model directory and fs root. Skipped where there is none."""

from __future__ import annotations

import importlib.metadata as md
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from kvtiers_vllm.compat import SUPPORTED, minor_of

from tests.vllm import harness as h
from tests.vllm.test_levels import BLOCKS, config
from tests.vllm.test_spec import drive, loaded, tokens

REPO = Path(__file__).resolve().parents[2]


def _candidates() -> list[tuple[str, str | None]]:
    """Interpreters that may hold another vLLM, each with the PYTHONPATH to run it
    under: every virtual environment at the repository root, and this interpreter
    with each vLLM installed beside this environment (`make`'s `.venv/vllm-0.34`,
    put first on PYTHONPATH) or with none of them (this environment's own vLLM)."""
    found: list[tuple[str, str | None]] = [
        (str(p), None) for p in sorted(REPO.glob(".venv*/bin/python"))
        if p.parents[1].resolve() != Path(sys.prefix).resolve()]
    found.append((sys.executable, None))
    found += [(sys.executable, str(d)) for d in sorted(Path(sys.prefix).glob("vllm-*"))]
    return found


def _env(pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def other_vllm() -> tuple[str, str | None, str] | None:
    """(interpreter, PYTHONPATH, version) of another supported vLLM minor than this
    process's."""
    mine = minor_of(md.version("vllm"))
    for python, pythonpath in _candidates():
        probe = subprocess.run(
            [python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
            capture_output=True, text=True, timeout=60, check=False, env=_env(pythonpath),
        )  # fmt: skip
        version = probe.stdout.strip()
        if probe.returncode == 0 and minor_of(version) in SUPPORTED and minor_of(version) != mine:
            return python, pythonpath, version
    return None


OTHER = other_vllm()
#: the levels (writer on the other vLLM, reader here): `make test` runs this file once
#: on each supported minor, so an upgrade (read on the newest) checks level 1 -> 2 and
#: a downgrade level 2 -> 1; together both directions and both orders of levels
CASES = [(1, 2)] if minor_of(md.version("vllm")) == SUPPORTED[-1] else [(2, 1)]


@pytest.mark.skipif(OTHER is None, reason="no environment with another supported vLLM")
@pytest.mark.parametrize(("writer", "reader"), CASES)
def test_blocks_another_vllm_stored_are_hits_here(
    model_dir: Path, tmp_path: Path, writer: int, reader: int
) -> None:
    assert OTHER is not None
    python, pythonpath, version = OTHER
    root, seed = tmp_path / "fs", 50 + 3 * writer + reader
    done = subprocess.run(
        [python, "-m", "tests.vllm.upgrade_writer", str(writer), str(root),
         str(model_dir), str(seed)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env=_env(pythonpath),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == version
    e = h.Engine(model_dir, config(reader, root))
    try:
        rng = random.Random(seed)
        e.add("reader", tokens(rng, BLOCKS) + tokens(rng, 1), 2)
        # Every block came from fs (this engine's pool and GPU cache started empty),
        # each page byte for byte what the other vLLM's model wrote.
        assert loaded(drive(e)) == BLOCKS and e.pages_checked == BLOCKS
    finally:
        e.close()
