"""Two SGLang servers of one model on one fs root: what this process stores, a
fresh process finds and loads, byte for byte; a server of another model finds none
of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .harness import extra_config, fs_tier, make_backend
from .peer_process import pages_of

REPO = Path(__file__).resolve().parents[2]
PAGES = 24
SEED = 21


def test_a_second_process_loads_every_page_and_another_model_none(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    keys, pool, _ = pages_of(SEED, PAGES)
    writer, _ = make_backend(extra_config([fs_tier(root)]), pool, model="org/model-a")
    assert writer.batch_set_v1(keys, pool.indices(list(range(PAGES)))) == [True] * PAGES
    writer.close()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.sglang.peer_process", str(root), str(SEED), str(PAGES),
         "org/model-a", "org/model-b"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    every = [True] * PAGES
    assert seen["org/model-a"] == {"found": PAGES, "loaded": every, "same": every}
    assert seen["org/model-b"]["found"] == 0
    assert seen["org/model-b"]["loaded"] == [False] * PAGES
