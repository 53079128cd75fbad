"""vLLM's per-request and spec options that `KvtiersOffloadingSpec` (level 2) honours
as vLLM's own specs do, through vLLM's real scheduler on CPU (tests/vllm/harness.py):
a request's `kv_load_tiers`, the tier each hit came from (`get_load_source`, as
vLLM's prefix-hit counters read it), `store_threshold`, `canonical_layout`. Level 1
(a kvtiers tier under vLLM's tiering spec) gets `kv_load_tiers` from vLLM itself:
checked here too. Every reloaded page is checked byte for byte by the harness."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtiers_vllm.plugin import TIER_TYPE, register
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from tests.vllm import harness as h
from tests.vllm.test_spec import CHUNK, drive, extra, loaded, pool, record, tokens

TIERING = "OptionsTieringSpec"
h.cpu_worker_spec(TieringOffloadingSpec, TIERING)
VLLM_CPU = "OptionsVllmCpuSpec"
h.cpu_worker_spec(CPUOffloadingSpec, VLLM_CPU)
register()
BLOCKS = 8
ONLY_CPU = [{"medium": "CPU"}]
ONLY_LOCAL_STORAGE = [{"medium": "storage", "locality": "local"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return h.write_tiny_llama(tmp_path_factory.mktemp("model"))


@pytest.fixture
def engines() -> Iterator[list[h.Engine]]:
    made: list[h.Engine] = []
    yield made
    for e in made:
        e.close()


def engine(engines: list[h.Engine], model: Path, cfg: dict[str, Any], **kw: Any) -> h.Engine:
    e = h.Engine(model, cfg, **kw)
    engines.append(e)
    e.payloads = record(e.connector, "get_kv_connector_stats")  # type: ignore[attr-defined]
    return e


def hit_sources(e: h.Engine) -> list[dict[CacheHitSource, int]]:
    """What vLLM's scheduler records per admitted request from now on: hit tokens by
    source (the list fills as the engine runs)."""
    return record(e.connector, "get_external_cache_hit_sources")


def level1(root: Path, slots: int) -> dict[str, Any]:
    root.mkdir(exist_ok=True)
    inner = {"type": "fs", "root_dir": str(root), "capacity_bytes": 64 << 20}
    return {
        "spec_name": TIERING, "spec_module_path": h.SPEC_MODULE,
        "cpu_bytes_to_use": slots * CHUNK, "secondary_tiers": [{"type": TIER_TYPE, "tier": inner}],
    }  # fmt: skip


def pushed_to_fs(e: h.Engine, rng: random.Random, n: int) -> list[list[int]]:
    """`n` prompts stored, then pushed out of the 16-slot pool and the GPU's cache:
    only the fs tier has them."""
    prompts = [tokens(rng, BLOCKS) for _ in range(n)]
    for i, p in enumerate(prompts):
        e.add(f"first{i}", p, 2)
        drive(e)
    for i in range(3):
        e.add(f"filler{i}", tokens(rng, BLOCKS), 2)
        drive(e)
    assert e.scheduler.reset_prefix_cache()
    return prompts


# ------------------------------------------------------------------ kv_load_tiers


@pytest.mark.parametrize("level", [1, 2])
def test_kv_load_tiers_keeps_a_request_off_the_tiers_it_excludes(
    engines: list[h.Engine], model: Path, tmp_path: Path, level: int
) -> None:
    cfg = extra(16, tmp_path / "fs") if level == 2 else level1(tmp_path / "fs", 16)
    e = engine(engines, model, cfg)
    rng = random.Random(31)
    a, b, c = pushed_to_fs(e, rng, 3)
    # Only CPU tiers (the pool): fs is never asked; the prompt is computed again.
    e.add("cpu-only", a + tokens(rng, 1), 2, kv_transfer_params={"kv_load_tiers": ONLY_CPU})
    assert loaded(drive(e)) == 0
    # An empty list allows no secondary tier either (vLLM's reading of []).
    e.add("none", b + tokens(rng, 1), 2, kv_transfer_params={"kv_load_tiers": []})
    assert loaded(drive(e)) == 0
    # Local storage allowed: fs serves it, every page checked.
    before = e.pages_checked
    e.add("fs-ok", c + tokens(rng, 1), 2,
          kv_transfer_params={"kv_load_tiers": ONLY_LOCAL_STORAGE})  # fmt: skip
    assert loaded(drive(e)) == BLOCKS and e.pages_checked == before + BLOCKS
    if level == 2:
        assert pool(e)["tiers"]["fs"]["promoted_hits"] == BLOCKS


def test_a_filter_is_per_request_and_the_pool_is_always_asked(
    engines: list[h.Engine], model: Path, tmp_path: Path
) -> None:
    e = engine(engines, model, extra(64, tmp_path / "fs"))
    rng = random.Random(32)
    p = tokens(rng, BLOCKS)
    e.add("first", p, 2)
    drive(e)
    assert e.scheduler.reset_prefix_cache()
    # In the pool: a request that excludes every secondary tier still loads it.
    e.add("pool", p + tokens(rng, 1), 2, kv_transfer_params={"kv_load_tiers": []})
    assert loaded(drive(e)) == BLOCKS


# ------------------------------------------------------------------ get_load_source


def test_hits_are_counted_by_the_tier_they_came_from(
    engines: list[h.Engine], model: Path, tmp_path: Path
) -> None:
    e = engine(engines, model, extra(16, tmp_path / "fs"))
    rng = random.Random(33)
    (a,) = pushed_to_fs(e, rng, 1)
    sources = hit_sources(e)
    e.add("from-fs", a + tokens(rng, 1), 2)
    assert loaded(drive(e)) == BLOCKS
    assert sources == [{CacheHitSource.DISK: BLOCKS * h.BLOCK}]
    # Now in the pool: the next request's hits are the host's.
    assert e.scheduler.reset_prefix_cache()
    e.add("from-pool", a + tokens(rng, 1), 2)
    assert loaded(drive(e)) == BLOCKS
    assert sources[-1] == {CacheHitSource.HOST: BLOCKS * h.BLOCK}


def test_vllms_own_tiering_reports_the_same_sources(
    engines: list[h.Engine], model: Path, tmp_path: Path
) -> None:
    """The reference: the same run through vLLM's tiering spec and fs tier."""
    root = tmp_path / "vfs"
    cfg = {
        "spec_name": TIERING, "spec_module_path": h.SPEC_MODULE, "cpu_bytes_to_use": 16 * CHUNK,
        "secondary_tiers": [{"type": "fs", "root_dir": str(root)}],
    }  # fmt: skip
    e = engine(engines, model, cfg)
    rng = random.Random(33)
    (a,) = pushed_to_fs(e, rng, 1)
    sources = hit_sources(e)
    e.add("from-fs", a + tokens(rng, 1), 2)
    assert loaded(drive(e)) == BLOCKS
    assert sources == [{CacheHitSource.DISK: BLOCKS * h.BLOCK}]


# ------------------------------------------------------------------ store_threshold


def counters(e: h.Engine) -> dict[str, float]:
    """The connector's counters, summed over every stats payload of the run (the
    payloads are recorded from the engine's first step: `record_payloads`)."""
    stats = OffloadingConnectorStats()
    for payload in e.payloads:  # type: ignore[attr-defined]
        if payload is not None:
            stats.aggregate(payload)
    types, values = stats.metric_sections()
    return {name: v.get((), 0) for name, v in values.items() if types[name] == "counter"}


def _threshold_run(e: h.Engine) -> list[int]:
    """The same prompt four times, the GPU's cache reset between: blocks loaded each time."""
    rng = random.Random(34)
    p = tokens(rng, BLOCKS)
    out = []
    for i in range(4):
        e.add(f"t{i}", p + tokens(rng, 1), 2)
        out.append(loaded(drive(e)))
        assert e.scheduler.reset_prefix_cache()
    return out


@pytest.mark.parametrize("threshold", [2, 3])
def test_store_threshold_stores_a_block_once_offered_that_often_as_vllms_cpu_spec(
    engines: list[h.Engine], model: Path, threshold: int
) -> None:
    ours = engine(engines, model, extra(64, store_threshold=threshold))
    got, skipped = _threshold_run(ours), counters(ours)["vllm:kv_offload_kvtiers_stores_skipped"]
    vllm_cfg = {
        "spec_name": VLLM_CPU, "spec_module_path": h.SPEC_MODULE,
        "cpu_bytes_to_use": 64 * CHUNK, "store_threshold": threshold,
    }  # fmt: skip
    theirs = engine(engines, model, vllm_cfg)
    want = _threshold_run(theirs)
    assert got == want
    # Offered `threshold` times before the pool takes it, loaded from then on.
    assert got == [0] * threshold + [BLOCKS] * (4 - threshold)
    assert skipped == counters(theirs)[CPUOffloadingMetrics.STORES_SKIPPED] >= BLOCKS


def test_store_threshold_off_and_wrong_values(model: Path) -> None:
    with pytest.raises(ValueError, match="store_threshold"):
        h.Engine(model, extra(16, store_threshold=-1)).close()
    with pytest.raises(ValueError, match="max_tracker_size"):
        h.Engine(model, extra(16, store_threshold=2, max_tracker_size="many")).close()


# ------------------------------------------------------------------ canonical_layout


def test_canonical_layout_with_kvtiers_worker_is_refused_at_once(model: Path) -> None:
    with pytest.raises(ValueError, match="canonical_layout"):
        h.Engine(model, extra(16, canonical_layout=True, kvtiers_worker="kvtiers")).close()


def _caches(mapping: Any) -> Any:
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )

    gpu, _ = h.worker_kv_caches(4, 1)
    return CanonicalKVCaches(
        [CanonicalKVCacheTensor(t, h.PAGE) for t in gpu],
        [[CanonicalKVCacheRef(i, h.PAGE, mapping) for i in range(h.LAYERS)]],
    )


def test_canonical_layout_goes_to_vllms_worker_after_vllms_checks(
    engines: list[h.Engine], model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's CUDA worker writes the canonical layout (it needs a GPU: recorded
    here); the spec certifies every layer first, as vLLM's tiering spec does."""
    import vllm.v1.kv_offload.cpu.gpu_worker as gpu_worker
    from vllm.v1.kv_offload.base import CanonicalPageMapping

    made: list[dict[str, Any]] = []

    def worker(**kw: Any) -> dict[str, Any]:
        made.append(kw)
        return kw

    monkeypatch.setattr(gpu_worker, "CPUOffloadingWorker", worker)
    e = engine(engines, model, extra(16, canonical_layout=True))
    spec = e.worker_spec
    assert spec.config.canonical_layout
    with pytest.raises(RuntimeError, match="canonical_layout .* could\\s+not be certified"):
        spec.create_worker(_caches(None))  # a layer without a canonical mapping
    assert made == []
    mapping = CanonicalPageMapping(h.PAGE, h.PAGE, (), 1, 0, parallelism_agnostic=True)
    spec.create_worker(_caches(mapping))
    assert made[-1]["canonical_layout"] is True and spec.all_layers_portable is True
    made[-1]["mmap_region"].cleanup()
    # Without canonical_layout vLLM's worker gets the direct layout, unchecked.
    plain = engine(engines, model, extra(16))
    plain.worker_spec.create_worker(_caches(None))
    assert made[-1]["canonical_layout"] is False
    made[-1]["mmap_region"].cleanup()
