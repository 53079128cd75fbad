"""The model check: a tiny transformer's logits are bit-identical whether its KV
stayed resident, came back from the CPU pool, or came back from fs."""

from __future__ import annotations

from pathlib import Path

import torch
from kvtiers.bench.model import TinyConfig, TinyDecoder
from kvtiers.bench.model_check import GEN_TOKENS, TURNS, RunLog, converse, run_model_check

from .conftest import kvtiers


def test_logits_identical_across_resident_cpu_and_fs_reloads(tmp_path: Path) -> None:
    result = run_model_check(str(tmp_path))
    assert result.ok, result.as_dict()
    resident, cpu, fs = result.runs
    assert result.steps == TURNS * GEN_TOKENS
    assert all(result.identical.values())
    assert cpu.reloaded_blocks > 0 and cpu.promoted_blocks == 0
    # Run 3's pages all came back from fs, the CPU pool having been emptied.
    assert fs.reloaded_blocks == cpu.reloaded_blocks == fs.promoted_blocks
    assert result.control_differs  # scrambled pages without a reload do change the logits
    assert list(tmp_path.iterdir()) == []  # its fs directory is gone


def test_the_model_reads_its_pages(tmp_path: Path) -> None:
    """Same conversation twice: identical logits; with a page scrambled in between,
    the next turn's logits differ (the pages, not a side copy, feed attention)."""
    torch.manual_seed(0)
    model = TinyDecoder(TinyConfig(layers=2, num_pages=24))
    a, b, c = RunLog("a"), RunLog("b"), RunLog("c")
    converse(model, a)
    converse(model, b)
    gen = torch.Generator().manual_seed(5)
    converse(model, c, lambda cached, table: model.scramble_pages(table[:1], gen))
    assert all(torch.equal(x, y) for x, y in zip(a.logits, b.logits, strict=True))
    first_turn = GEN_TOKENS
    assert all(
        torch.equal(x, y) for x, y in zip(a.logits[:first_turn], c.logits[:first_turn], strict=True)
    )
    assert not torch.equal(a.logits[first_turn], c.logits[first_turn])


def test_cli_model_check(tmp_path: Path) -> None:
    done = kvtiers(
        "bench", "--model-check", "--tmp-dir", str(tmp_path), "--json", str(tmp_path / "mc.json")
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "model check PASSED" in done.stdout
    assert "promoted from fs" in done.stdout
    assert (tmp_path / "mc.json").exists()
