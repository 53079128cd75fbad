"""kvtiers tiers under vLLM's own offloading (level 1), through vLLM's real Scheduler
and OffloadingConnector on CPU (tests/vllm/harness.py).
"""

from __future__ import annotations

import importlib.metadata as md
import random
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtiers_vllm import compat  # noqa: E402
from kvtiers_vllm.plugin import SPEC_NAME, TIER_TYPE, register  # noqa: E402
from kvtiers_vllm.tier import KvtiersTier  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from . import harness  # noqa: E402
from .conftest import MakeEngine  # noqa: E402

SPEC = "HarnessTieringSpec"
harness.cpu_worker_spec(TieringOffloadingSpec, SPEC)
register()  # what vLLM's plugin loader does in each of its processes

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


def kvtiers_entry(root: Path, capacity: int = 10**8, **extra: Any) -> dict[str, Any]:
    """A secondary_tiers entry running kvtiers' fs tier under vLLM's spec."""
    root.mkdir(parents=True, exist_ok=True)
    tier = {"type": "fs", "root_dir": str(root), "capacity_bytes": capacity}
    return {"type": TIER_TYPE, "tier": tier, **extra}


def kvtiers_tier(engine: harness.Engine) -> KvtiersTier:
    (tier,) = engine.manager.secondary_tiers
    assert isinstance(tier, KvtiersTier)
    return tier


def record_lookups(owner: Any) -> list[LookupResult]:
    """Every answer `owner` (vLLM's manager, or a tier) gives from now on."""
    answers: list[LookupResult] = []
    lookup = owner.lookup

    def recording(key: Any, req_context: Any) -> LookupResult:
        answers.append(lookup(key, req_context))
        return answers[-1]

    owner.lookup = recording
    return answers


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


def test_round_trip_through_a_kvtiers_tier(make_engine: MakeEngine, tmp_path: Path) -> None:
    """GPU -> vLLM's CPU tier -> kvtiers' fs tier, then, once the GPU and CPU copies
    are evicted (LRU, by other prompts), fs -> CPU -> GPU: every reloaded page
    byte-identical; the keys stored are vLLM's own OffloadKeys, untouched."""
    engine = make_engine(extra_config([kvtiers_entry(tmp_path / "fs")]), num_blocks=16)
    tier = kvtiers_tier(engine)
    rnd = random.Random(11)
    tokens = prompt(rnd)
    first = engine.add("first", tokens, max_tokens=2)
    engine.run()
    blocks = len(tokens) // harness.BLOCK
    assert tier.tier.stats().blocks_written == blocks
    held = set().union(*(ns.keys() for ns in tier.tier.inventory().namespaces))
    assert held == {make_offload_key(h, 0) for h in first.block_hashes[:blocks]}
    evict_cpu_and_gpu(engine, rnd)
    answers = record_lookups(engine.manager)
    read_before = tier.tier.stats().blocks_read
    engine.add("again", tokens, max_tokens=1)
    loaded = sum(r.loaded_pages for r in engine.run())
    assert loaded == blocks and engine.pages_checked >= blocks
    assert tier.tier.stats().blocks_read - read_before == blocks  # from fs, not the CPU
    assert answers[-1] is LookupResult.HIT


def test_retry_then_hit_pending_then_load_from_a_shared_store(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    """Two engines share one fs root (two vLLM instances on one filesystem). What the
    first stores, the second's kvtiers tier does not know yet: it answers RETRY (a
    probe), then HIT; vLLM's manager answers RETRY, then HIT_PENDING while the
    promotion runs (loads delayed 50 ms by a `faulty` wrapper), then HIT, and the
    second engine loads the first one's bytes, identical."""
    root = tmp_path / "shared"
    writer = make_engine(extra_config([kvtiers_entry(root)]), num_blocks=16)
    entry = kvtiers_entry(root)
    entry["tier"] = {"type": "faulty", "inner": entry["tier"], "latency_s": 0.05, "ops": ["load"]}
    reader = make_engine(extra_config([entry]), num_blocks=16)
    tokens = prompt(random.Random(5))
    writer.add("w", tokens, max_tokens=1)
    writer.run()
    tier_answers = record_lookups(kvtiers_tier(reader))
    answers = record_lookups(reader.manager)
    reader.add("r", tokens, max_tokens=1)
    statuses = []
    while reader.scheduler.requests:
        result = reader.step()
        statuses.append((harness.status(reader, "r"), result.loaded_pages))
        time.sleep(0.005)
    blocks = len(tokens) // harness.BLOCK
    assert sum(n for _, n in statuses) == blocks and reader.pages_checked == blocks
    assert tier_answers[0] is LookupResult.RETRY and LookupResult.HIT in tier_answers
    order = [a for i, a in enumerate(answers) if i == 0 or answers[i - 1] is not a]
    assert order[:3] == [LookupResult.RETRY, LookupResult.HIT_PENDING, LookupResult.HIT]
    assert (RequestStatus.WAITING_FOR_REMOTE_KVS, blocks) in statuses


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
