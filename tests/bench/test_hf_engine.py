"""`kvtiers bench --engine hf` on CPU: a transformers decoder (the `tiny` preset,
random weights) whose paged KV cache goes through kvtiers, the same code that runs
on a GPU. Reloaded pages hold exactly the bytes stored, and the logits after a
reload are bit-identical to those with the same pages kept resident."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from kvtiers.bench.engine import PageAllocator
from kvtiers.bench.hf.decoder import HfDecoder
from kvtiers.bench.hf.limits import DiskProbe, disk_read, median_gbps, pinned_copy_s
from kvtiers.bench.hf.multiturn import Workload, run_multiturn
from kvtiers.bench.hf.offload import Offload
from kvtiers.bench.hf.paged import PagedKV
from kvtiers.bench.hf.presets import HF_PRESETS
from kvtiers.bench.hf.ttft import TtftRun, run_disk_gbps, run_fs_gbps
from kvtiers.bench.model_check import deterministic
from kvtiers.cli import main

TINY = HF_PRESETS["tiny"]
CPU = torch.device("cpu")
T = TINY.page_tokens
SLOT = TINY.geometry().block_bytes  # a multiple of 4 KiB: slot = block


@pytest.fixture(scope="module")
def decoder() -> HfDecoder:
    return HfDecoder(TINY, CPU, seed=0)


def _config(fs_root: Path | None, slots: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"cpu_bytes_to_use": slots * SLOT}
    if fs_root is not None:
        doc["secondary_tiers"] = [{"type": "fs", "root_dir": str(fs_root),
                                   "capacity_bytes": 64 << 20, "shared": False}]
    return doc


@pytest.mark.parametrize("layout", ["layer", "cross"])
def test_reloaded_pages_hold_the_stored_bytes(decoder: HfDecoder, ram_dir: Path,
                                              layout: str) -> None:
    """Pages written by a real prefill, stored, overwritten, promoted from fs and
    loaded into other pages: byte for byte what the prefill wrote."""
    cache = PagedKV(TINY, 32, layout, CPU)
    off = Offload(_config(ram_dir, 16), TINY, cache)
    try:
        tokens = np.random.default_rng(3).integers(0, TINY.vocab, 6 * T).tolist()
        first, other = np.arange(0, 6), np.arange(10, 16)
        decoder.forward(cache, [tokens], [0], [torch.from_numpy(first)])
        before = [cache.plane(layer, kv)[first].clone()
                  for layer in range(TINY.layers) for kv in (0, 1)]
        assert all(bool(b.abs().sum() > 0) for b in before)  # the prefill wrote them
        keys = off.keys(tokens)
        assert off.store(keys, first)
        off.drain_cascades()
        off.mgr.reset()  # the pool forgets them: fs serves the load
        cache.scramble(torch.from_numpy(other), seed=1)
        found = off.find(keys)
        assert found.hits == 6 and found.promoted == 6
        off.load(keys, other)
        after = [cache.plane(layer, kv)[other] for layer in range(TINY.layers) for kv in (0, 1)]
        assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    finally:
        off.close()


def test_find_load_swaps_in_leading_blocks_while_the_rest_is_promoted(
        decoder: HfDecoder, ram_dir: Path) -> None:
    """The first blocks are in the pool, the rest only on fs: the first are swapped
    in before the promotions of the rest land; every page ends with the stored bytes."""
    cache = PagedKV(TINY, 32, "cross", CPU)
    off = Offload(_config(ram_dir, 16), TINY, cache)
    try:
        tokens = np.random.default_rng(5).integers(0, TINY.vocab, 6 * T).tolist()
        first, other = np.arange(0, 6), np.arange(10, 16)
        decoder.forward(cache, [tokens], [0], [torch.from_numpy(first)])
        before = [cache.plane(layer, kv)[first].clone()
                  for layer in range(TINY.layers) for kv in (0, 1)]
        keys = off.keys(tokens)
        assert off.store(keys, first)
        off.drain_cascades()
        off.mgr.reset()
        head = off.find_load(keys[:3], np.arange(20, 23))  # promoted: now in the pool
        assert head.hits == 3 and head.promoted == 3 and head.early == 0
        cache.scramble(torch.from_numpy(other), seed=2)
        got = off.find_load(keys, other)
        assert got.hits == 6 and got.promoted == 3  # the rest came from fs
        assert got.early == 3  # swapped in while those three were promoted
        after = [cache.plane(layer, kv)[other] for layer in range(TINY.layers) for kv in (0, 1)]
        assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
        assert off.pending() == 0
    finally:
        off.close()


@pytest.mark.parametrize("layout", ["layer", "cross"])
def test_ttft_cases_reload_bit_identical(decoder: HfDecoder, ram_dir: Path,
                                         layout: str) -> None:
    with deterministic(threads=1):
        probe = DiskProbe(str(ram_dir), 8 << 20)
        run = TtftRun(decoder, TINY, layout, 2 * 256 // T + 8, _config(ram_dir, 24), reps=2,
                      seed=0, probe=probe)
        try:
            case = run.measure(256, 32, control=True)
        finally:
            run.close()
            probe.close()
    cached_blocks = (256 - 32) // T
    assert case.identical_pool and case.identical_fs and case.identical_partial
    assert case.control_differs  # scrambled and not reloaded: the logits change
    assert len(case.pool_hits) == 2 and len(case.fs_hits) == 2
    for pool in case.pool_hits:
        assert pool.hit_blocks == cached_blocks and pool.promoted_blocks == 0
    for fs in case.fs_hits:  # each one promoted every block again
        assert fs.hit_blocks == fs.promoted_blocks == cached_blocks
    assert case.fs_hit in case.fs_hits
    # one disk read before each fs hit: of the same bytes, at least one 2 MiB request
    assert cached_blocks * SLOT < 2 << 20
    assert [r.nbytes for r in case.disk_reads] == [2 << 20] * 2
    assert case.disk_gbps(None) == median_gbps(case.disk_reads)
    # the run's disk speed: bytes / seconds of all its reads, the fs limit's speed
    run_gbps = run_disk_gbps([case, case], None)
    assert run_gbps == pytest.approx(sum(r.nbytes for r in case.disk_reads)
                                     / sum(r.seconds for r in case.disk_reads) / 1e9)
    s = case.summary(None, run_gbps)
    assert s["fs_disk_limit_s"] == pytest.approx(case.kv_bytes / (run_gbps * 1e9) + case.rest)
    assert s["fs_over_row_disk_limit"] == pytest.approx(
        s["fs_hit_s"] / (case.kv_bytes / (median_gbps(case.disk_reads) * 1e9) + case.rest))
    assert run_fs_gbps([case]) == pytest.approx(
        2 * case.kv_bytes / sum(b.promote_s for b in case.fs_hits) / 1e9)
    assert case.partial is not None and case.partial.hit_blocks == cached_blocks // 2
    assert case.kv_bytes == cached_blocks * SLOT
    assert 0 <= case.max_abs_vs_recompute < 1e-3  # float32: chunking moves only rounding
    assert len(case.recompute_s) == 2 and case.copy_s > 0


def test_sizes_off_the_page_grid_are_refused(decoder: HfDecoder, ram_dir: Path) -> None:
    run = TtftRun(decoder, TINY, "layer", 40, _config(None, 24), reps=1, seed=0)
    try:
        with pytest.raises(ValueError, match="multiples of the page size"):
            run.measure(250, 32, control=False)
    finally:
        run.close()


def test_multiturn_modes(decoder: HfDecoder, ram_dir: Path) -> None:
    w = Workload(sessions=6, prefixes=2, prefix_tokens=8 * T, turns=3, user_tokens=3 * T,
                 output_tokens=6, concurrency=3, seed=1)
    with deterministic(threads=1):
        none = run_multiturn(decoder, TINY, "layer", w, "recompute", None)
        cpu = run_multiturn(decoder, TINY, "layer", w, "cpu", _config(None, 24))
        fs = run_multiturn(decoder, TINY, "cross", w, "fs", _config(ram_dir, 24))
    for r in (none, cpu, fs):
        assert r.requests == w.sessions * w.turns
        assert r.generated_tokens == r.requests * w.output_tokens
        assert r.from_pool_tokens + r.from_fs_tokens + r.recomputed_tokens == r.prompt_tokens
    assert none.prompt_tokens == cpu.prompt_tokens == fs.prompt_tokens  # same seed, same work
    assert none.recomputed_tokens == none.prompt_tokens
    assert cpu.from_pool_tokens > 0 and cpu.from_fs_tokens == 0
    assert fs.from_fs_tokens > 0  # a 24-slot pool cannot hold the working set
    assert fs.kvtiers_stats["tiers"]["fs"]["promoted_hits"] > 0


def test_limits(tmp_path: Path) -> None:
    read = disk_read(str(tmp_path), 4 << 20)
    assert read.nbytes == 4 << 20 and read.gbps > 0
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    probe = DiskProbe(str(tmp_path), 6 << 20)
    try:  # a part of it, rounded down to 2 MiB; never more than it holds
        assert [probe.read(n).nbytes for n in (5 << 20, 64 << 20)] == [4 << 20, 6 << 20]
    finally:
        probe.close()
    assert list(tmp_path.iterdir()) == []
    src = torch.randint(0, 255, (8, 4096), dtype=torch.uint8)
    assert pinned_copy_s(src, 8 * 4096, 4, CPU, reps=2) > 0


def test_page_allocator_is_shared_with_the_stand_in() -> None:
    pages = PageAllocator(4)
    got = pages.alloc(4)
    assert got is not None and pages.alloc(1) is None
    pages.release(got)
    assert pages.free == 4


def test_cli_engine_hf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command line, in this process (torch and transformers are imported already)."""
    out = tmp_path / "hf.json"
    status = main([
        "bench", "--engine", "hf", "--hf-model", "tiny", "--device", "cpu",
        "--ttft-tokens", "128", "--ttft-layouts", "cross", "--rest-tokens", "32",
        "--reps", "1", "--sessions", "4", "--prefixes", "2", "--prefix-tokens", "64",
        "--prompt-tokens", "32", "--output-tokens", "4", "--turns", "2",
        "--sessions-in-flight", "2", "--tmp-dir", str(tmp_path), "--json", str(out),
    ])
    printed = capsys.readouterr()
    assert status == 0, printed.out + printed.err
    assert "bit-identical to the same pages kept resident: yes" in printed.out
    doc = json.loads(out.read_text())
    assert doc["ok"] is True
    (case,) = doc["ttft"]["cases"]
    assert case["layout"] == "cross" and case["tokens"] == 128
    assert {"gain", "limit_gain", "share_of_limit_gain", "fs_over_disk_limit"} <= set(
        case["summary"])
    modes = [r["mode"] for r in doc["multiturn"]["results"]]
    assert len(modes) == 3 and doc["multiturn"]["results"][0]["hit_rate_pool"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf.json"]  # its fs root is gone


@pytest.mark.parametrize("extra, says", [
    (["--compare"], "--compare belong to the stand-in replay"),
    (["--config", "{}"], "--config belong to the stand-in replay"),
    (["--ttft-layouts", "layer,rows"], "layer and/or cross, got rows"),
    (["--ttft-tokens", "2k"], "comma-separated token counts"),
    (["--reps", "0"], "--reps must be at least 1"),
    (["--hf-dtype", "int3"], "--hf-dtype: unknown dtype 'int3'; known: bfloat16"),
    (["--ttft-tokens", "2048,1000"], "multiples of the page size (16), each prompt longer "
                                     "than --rest-tokens (128); refused: 1000"),
    (["--rest-tokens", "100"], "refused: 100"),
])
def test_cli_engine_hf_refuses(extra: list[str], says: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["bench", "--engine", "hf", "--hf-model", "tiny", "--device", "cpu", *extra])
    printed = capsys.readouterr()
    assert status == 2 and says in printed.err, printed.err
