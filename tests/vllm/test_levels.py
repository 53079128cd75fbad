"""The two levels of kvtiers-vllm share what they store, and both let vLLM unmap its
shared CPU region at shutdown. Through vLLM's real scheduler on CPU
(tests/vllm/harness.py); every page a load writes is checked against the bytes the
"model" wrote for its tokens.

- Level 1: kvtiers' fs tier under vLLM's `TieringOffloadingSpec` (`KvtiersTier`).
- Level 2: `KvtiersOffloadingSpec` with kvtiers' fs tier.

Both name their blocks by vLLM's run identity (`kvtiers_vllm.identity`), so one fs
root serves either: an engine of one level writes, the next engine (a new process's
worth of state: new engine id, new CPU pool, an empty GPU cache) of the other level
reads the blocks back as hits."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from tests.vllm import harness as h
from tests.vllm.test_spec import REGION_LOGGER, drive, extra, kept_mapped, loaded, tokens
from tests.vllm.test_spec_options import level1

BLOCKS = 10


def config(level: int, root: Path, slots: int = 16) -> dict[str, Any]:
    return level1(root, slots) if level == 1 else extra(slots, root)


def write(model: Path, level: int, root: Path, prompt: list[int]) -> None:
    """One engine of `level` computes `prompt` and stores it down to fs, then closes."""
    e = h.Engine(model, config(level, root))
    try:
        e.add("writer", prompt, 2)
        drive(e)
    finally:
        e.close()


@pytest.mark.parametrize(("writer", "reader"), [(1, 2), (2, 1)])
def test_blocks_one_level_stored_are_hits_for_the_other(
    model_dir: Path, tmp_path: Path, writer: int, reader: int
) -> None:
    root = tmp_path / "fs"
    rng = random.Random(40 + writer)
    prompt = tokens(rng, BLOCKS)
    write(model_dir, writer, root, prompt)
    e = h.Engine(model_dir, config(reader, root))
    try:
        e.add("reader", prompt + tokens(rng, 1), 2)
        results = drive(e)
        # Every block came from fs (the reader's pool and GPU cache started empty),
        # each page byte for byte what the writer's model wrote.
        assert loaded(results) == BLOCKS and e.pages_checked == BLOCKS
        if reader == 2:
            assert e.manager.kvtiers_manager.stats()["tiers"]["fs"]["promoted_hits"] == BLOCKS
    finally:
        e.close()


def test_a_block_another_run_identity_stored_is_not_a_hit(
    model_dir: Path, tmp_path: Path
) -> None:
    """The reader's identity differs (two KV-cache groups): same root, no hits."""
    root = tmp_path / "fs"
    rng = random.Random(42)
    prompt = tokens(rng, BLOCKS)
    write(model_dir, 1, root, prompt)
    e = h.Engine(model_dir, config(2, root, slots=32), groups=2)
    try:
        e.add("reader", prompt + tokens(rng, 1), 2)
        assert loaded(drive(e)) == 0
    finally:
        e.close()


@pytest.mark.parametrize("level", [1, 2])
def test_shutdown_unmaps_vllms_region(
    model_dir: Path, tmp_path: Path, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    """After a run that cascaded to fs and promoted back, closing the engine leaves
    no view of vLLM's region behind: vLLM unmaps it without its "Keeping ... mapped"
    warning."""
    rng = random.Random(43)
    prompt = tokens(rng, BLOCKS)
    root = tmp_path / "fs"
    write(model_dir, level, root, prompt)
    e = h.Engine(model_dir, config(level, root))
    with caplog.at_level(logging.WARNING, logger=REGION_LOGGER):
        try:
            e.add("again", prompt + tokens(rng, 1), 2)
            assert loaded(drive(e)) == BLOCKS
        finally:
            e.close()
    assert not kept_mapped(caplog)
