"""One tier plugin serves vLLM and SGLang: the example tier of the plugin guide
(examples/kvtiers-scratch, unmodified, found through its `kvtiers` entry point)
under vLLM's own offloading (level 1: `{"type": "kvtiers", "tier": {...}}`, vLLM's
real scheduler and connector on CPU) and as SGLang's L3 storage, in one run; every
page loaded back byte-identical."""

from __future__ import annotations

import importlib.metadata as md
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from kvtiers.plugins import registry as plugin_registry
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from tests.vllm import harness
from tests.vllm.conftest import (  # noqa: F401
    MakeEngine,
    engine_id,
    make_engine,
    model_dir,
)

from .harness import extra_config, make_backend, page_keys

SCRATCH_SRC = Path(__file__).resolve().parents[2] / "examples" / "kvtiers-scratch" / "src"
SPEC = "HarnessTieringSpec"


@pytest.fixture
def scratch_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry as it is once kvtiers-scratch is installed: its entry point
    (`scratch = kvtiers_scratch.plugin`) next to the installed ones."""
    entry_points = list(md.entry_points(group="kvtiers"))
    if not any(ep.name == "scratch" for ep in entry_points):
        monkeypatch.syspath_prepend(str(SCRATCH_SRC))
        entry_points.append(md.EntryPoint("scratch", "kvtiers_scratch.plugin", "kvtiers"))
    registry = plugin_registry.load_registry(entry_points)
    assert "scratch" in registry.tiers, registry.failures
    monkeypatch.setattr(plugin_registry, "_cached", registry)


def scratch(root: Path) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    return {"type": "scratch", "root_dir": str(root), "capacity_bytes": 1 << 26}


def test_scratch_tier_under_vllm_and_sglang(
    scratch_installed: None, make_engine: MakeEngine, tmp_path: Path  # noqa: F811
) -> None:
    from kvtiers_vllm.plugin import register

    harness.cpu_worker_spec(TieringOffloadingSpec, SPEC)
    register()
    # vLLM, level 1: GPU -> vLLM's CPU tier -> scratch, then back once evicted
    chunk = harness.PAGE * harness.LAYERS
    engine = make_engine({
        "spec_name": SPEC, "spec_module_path": harness.SPEC_MODULE,
        "cpu_bytes_to_use": 32 * chunk,
        "secondary_tiers": [{"type": "kvtiers", "tier": scratch(tmp_path / "vllm")}],
    }, num_blocks=16)
    rnd = random.Random(17)
    tokens = [rnd.randrange(harness.VOCAB) for _ in range(100)]
    engine.add("first", tokens, max_tokens=2)
    engine.run()
    (tier,) = engine.manager.secondary_tiers
    blocks = len(tokens) // harness.BLOCK
    assert tier.tier.stats().blocks_written == blocks
    for i in range(6):  # other prompts evict the first one from the GPU and the CPU tier
        engine.add(f"filler-{i}", [rnd.randrange(harness.VOCAB) for _ in range(100)],
                   max_tokens=1)
        engine.run()
    engine.add("again", tokens, max_tokens=1)
    loaded = sum(r.loaded_pages for r in engine.run())
    assert loaded == blocks and engine.pages_checked >= blocks
    assert tier.options.section.type == "scratch"
    assert type(tier.tier).__module__ == "kvtiers_scratch.tier"

    # SGLang: the same tier, by the same name, as HiCache's L3 storage
    backend, pool = make_backend(extra_config([scratch(tmp_path / "sglang")]))
    gen = torch.Generator().manual_seed(17)
    pool.fill_random(gen)
    keys = page_keys(gen, 6)
    stored = [pool.page_bytes(p) for p in range(6)]
    assert backend.batch_set_v1(keys, pool.indices(list(range(6)))) == [True] * 6
    assert backend.batch_exists(keys) == 6
    pool.fill_random(gen)
    assert backend.batch_get_v1(keys, pool.indices([10, 11, 12, 13, 14, 15])) == [True] * 6
    assert [pool.page_bytes(p) for p in range(10, 16)] == stored
    assert backend.kvtiers_stats()["tiers"]["scratch"]["blocks_read"] == 12  # K and V halves
    backend.close()
    assert "kvtiers_scratch" in sys.modules
