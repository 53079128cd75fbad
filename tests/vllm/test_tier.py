"""kvtiers tiers under vLLM's own offloading (level 1), through vLLM's real Scheduler
and OffloadingConnector on CPU (tests/vllm/harness.py).
"""

from __future__ import annotations

import importlib.metadata as md
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtiers_vllm import compat  # noqa: E402
from kvtiers_vllm.plugin import SPEC_NAME, TIER_TYPE, register  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from . import harness  # noqa: E402
from .conftest import MakeEngine  # noqa: E402

SPEC = "HarnessTieringSpec"
harness.cpu_worker_spec(TieringOffloadingSpec, SPEC)

CHUNK_BYTES = harness.PAGE * harness.LAYERS  # one block of one group, all layers


def extra_config(tiers: list[dict[str, Any]], cpu_chunks: int = 32) -> dict[str, Any]:
    return {
        "spec_name": SPEC,
        "spec_module_path": harness.SPEC_MODULE,
        "cpu_bytes_to_use": cpu_chunks * CHUNK_BYTES,
        "secondary_tiers": tiers,
    }


def prompt(rnd: random.Random, n: int = 100) -> list[int]:
    return [rnd.randrange(harness.VOCAB) for _ in range(n)]


def evict_cpu_and_gpu(engine: harness.Engine, rnd: random.Random, prompts: int = 6) -> None:
    """Run other prompts until the first one's blocks left the GPU and the CPU tier."""
    for i in range(prompts):
        engine.add(f"filler-{engine.steps}-{i}", prompt(rnd), max_tokens=1)
        engine.run()


def test_vllm_fs_round_trip_through_the_harness(make_engine: MakeEngine, tmp_path: Path) -> None:
    """The baseline the harness reproduces: vLLM's own fs tier, GPU -> CPU -> fs ->
    CPU -> GPU, every reloaded page byte-identical (checked by the harness)."""
    engine = make_engine(
        extra_config([{"type": "fs", "root_dir": str(tmp_path / "fs")}]), num_blocks=16
    )
    rnd = random.Random(7)
    tokens = prompt(rnd)
    engine.add("first", tokens, max_tokens=2)
    engine.run()
    evict_cpu_and_gpu(engine, rnd)
    engine.add("again", tokens, max_tokens=1)
    loaded = sum(r.loaded_pages for r in engine.run())
    assert loaded == len(tokens) // harness.BLOCK
    assert engine.pages_checked >= loaded


# --- the version check and the entry point -------------------------------------------


def test_version_check_names_the_installed_version() -> None:
    assert compat.require_vllm() == md.version("vllm")
    for good in ("0.33.0", "0.33.4", "0.33.1rc2", "0.33.0+cu129"):
        assert compat.require_vllm(good) == good
    with pytest.raises(
        compat.UnsupportedVllmError, match=r"vLLM 0\.34\.0 .*supported: vLLM 0\.33\.x"
    ):
        compat.require_vllm("0.34.0")
    with pytest.raises(
        compat.UnsupportedVllmError, match=r"vLLM 0\.3\.3 .*supported: vLLM 0\.33\.x"
    ):
        compat.require_vllm("0.3.3")


def test_version_check_when_vllm_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "installed_vllm", lambda: None)
    with pytest.raises(compat.UnsupportedVllmError, match="not installed.*supported: vLLM 0.33.x"):
        compat.require_vllm()


def test_entry_point_registers_the_tier_and_the_spec() -> None:
    """The installed distribution's `vllm.general_plugins` entry point (what vLLM runs
    in each of its processes) registers both names, lazily, and tolerates running
    again."""
    (ep,) = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "kvtiers"]
    assert ep.dist is not None and ep.dist.name == "kvtiers-vllm"
    assert ep.load() is register
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # vLLM's own loader runs it
    assert TIER_TYPE in SecondaryTierFactory._registry
    assert SPEC_NAME in OffloadingSpecFactory._registry
    register()  # a second time in one process: no ValueError
    register()
