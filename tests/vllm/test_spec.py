"""`KvtiersOffloadingSpec` (level 2) through vLLM 0.33's real `Scheduler` and
`OffloadingConnector` on CPU (tests/vllm/harness.py): kvtiers' manager and tiers on
the scheduler side, a memcpy worker over vLLM's shared CPU region on the worker side.
Every page a load writes is checked against the bytes the "model" wrote for its
tokens (random-looking, never zeros)."""

from __future__ import annotations

import copy
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

import numpy as np
from kvtiers.config import load_config
from kvtiers_vllm.spec import KvtiersOffloadingSpec
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from tests.vllm import harness as h
from tests.vllm.vllm_compat import device_side

SPEC = "KvtiersCpuSpec"
h.cpu_worker_spec(KvtiersOffloadingSpec, SPEC)
CHUNK = h.PAGE * h.LAYERS  # bytes of one block of one group: one 4 KiB slot
PROMPT_BLOCKS = 10

# vLLM PR #46216's stress run, exactly as its author passed it, but for the spec.
PR46216_KVTIERS: dict[str, Any] = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "spec_name": "KvtiersOffloadingSpec",
        "cpu_bytes_to_use": 429496729600,
        "eviction_policy": "lru",
        "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/nvme_storage"}],
    },
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return h.write_tiny_llama(tmp_path_factory.mktemp("model"))


def extra(slots: int, root: Path | None = None, **more: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "spec_name": SPEC, "spec_module_path": h.SPEC_MODULE,
        "cpu_bytes_to_use": slots * CHUNK, "cascade_queue_blocks": 256,
        "kvtiers_stats_interval_s": 0,  # every payload carries the tiers' counters
    }  # fmt: skip
    if root is not None:
        root.mkdir(exist_ok=True)
        cfg["secondary_tiers"] = [{"type": "fs", "root_dir": str(root), "capacity_bytes": 64 << 20}]
    cfg.update(more)
    return cfg


@pytest.fixture
def engines(model: Path) -> Iterator[list[h.Engine]]:
    made: list[h.Engine] = []
    yield made
    for e in made:
        e.close()


def engine(engines: list[h.Engine], model: Path, cfg: dict[str, Any], **kw: Any) -> h.Engine:
    e = h.Engine(model, cfg, **kw)
    engines.append(e)
    return e


def tokens(rng: random.Random, blocks: int) -> list[int]:
    return [rng.randrange(h.VOCAB) for _ in range(blocks * h.BLOCK)]


def drive(e: h.Engine, max_steps: int = 400) -> list[h.StepResult]:
    """Step until every request finished and the tiers are idle."""
    results = []
    for _ in range(max_steps):
        results.append(e.step())
        if not e.scheduler.requests:
            break
        if not results[-1].output.num_scheduled_tokens:
            time.sleep(0.002)  # waiting on a tier's thread (probe, promotion)
    assert not e.scheduler.requests, list(e.scheduler.requests)
    e.settle()
    return results


def pool(e: h.Engine) -> dict[str, Any]:
    stats: dict[str, Any] = e.manager.kvtiers_manager.stats()
    return stats


def loaded(results: list[h.StepResult]) -> int:
    return sum(r.loaded_pages for r in results)


def record(obj: Any, method: str, *, flatten: bool = False) -> list[Any]:
    """Keep what `obj.method()` returns to its callers (the scheduler drains the
    connector's events and stats every step)."""
    seen: list[Any] = []
    inner = getattr(obj, method)

    def wrapper(*args: Any, **kw: Any) -> Any:
        out = inner(*args, **kw)
        if flatten:
            out = list(out)
            seen.extend(out)
        else:
            seen.append(out)
        return out

    setattr(obj, method, wrapper)
    return seen


def trace_lookups(e: h.Engine) -> list[str]:
    """Record what the kvtiers manager answers vLLM's lookups."""
    seen: list[str] = []
    adapter = e.manager
    inner = adapter._lookup

    def lookup(key: bytes, *tiers: Any) -> Any:
        result = inner(key, *tiers)
        seen.append(result.name)
        return result

    adapter._lookup = lookup
    return seen


# --------------------------------------------------------------------- data paths


def test_gpu_cpu_fs_cpu_gpu_round_trip_is_byte_identical(
    engines: list[h.Engine], model: Path, tmp_path: Path
) -> None:
    e = engine(engines, model, extra(16, tmp_path / "fs"))
    rng = random.Random(11)
    prompt = tokens(rng, PROMPT_BLOCKS)
    e.add("first", prompt, 2)
    drive(e)
    for i in range(3):  # push the first prompt out of the 16-slot pool
        e.add(f"other{i}", tokens(rng, PROMPT_BLOCKS), 2)
        drive(e)
    stats = pool(e)
    assert stats["pool"]["evictions"] >= PROMPT_BLOCKS
    assert stats["tiers"]["fs"]["cascaded_blocks"] == 4 * PROMPT_BLOCKS
    assert e.scheduler.reset_prefix_cache()  # the GPU forgets: only kvtiers has it
    seen = trace_lookups(e)
    e.add("again", prompt + tokens(rng, 1), 2)
    results = drive(e)
    assert loaded(results) == PROMPT_BLOCKS
    assert e.pages_checked == PROMPT_BLOCKS
    assert "HIT_PENDING" in seen and seen.index("HIT_PENDING") < seen.index("HIT")
    assert pool(e)["tiers"]["fs"]["promoted_hits"] == PROMPT_BLOCKS


def test_a_block_on_its_way_is_pending_then_loaded_from_the_pool(
    engines: list[h.Engine], model: Path
) -> None:
    e = engine(engines, model, extra(64))
    rng = random.Random(12)
    prompt = tokens(rng, 6)
    e.add("first", prompt, 2)
    drive(e)
    assert pool(e)["pool"]["stored_blocks"] == 6
    assert e.scheduler.reset_prefix_cache()
    e.add("again", prompt + tokens(rng, 1), 2)
    results = drive(e)
    assert loaded(results) == 6 and e.pages_checked == 6
    assert pool(e)["pool"]["pinned"] == 0


def test_two_kv_cache_groups_round_trip(
    engines: list[h.Engine], model: Path, tmp_path: Path
) -> None:
    e = engine(engines, model, extra(24, tmp_path / "fs"), groups=2)
    rng = random.Random(13)
    prompt = tokens(rng, 8)
    e.add("first", prompt, 2)
    drive(e)
    keys = e.manager.kvtiers_manager.stats()["pool"]["stored_blocks"]
    assert keys > 8  # blocks of both groups (the sliding window keeps its last ones)
    for i in range(3):
        e.add(f"other{i}", tokens(rng, 8), 2)
        drive(e)
    assert e.scheduler.reset_prefix_cache()
    e.add("again", prompt + tokens(rng, 1), 2)
    results = drive(e)
    groups = {g for _, g in e.worker.loaded}
    assert groups == {0, 1}
    assert loaded(results) == e.pages_checked > 8


def test_slots_come_back_in_key_order_group_by_group(
    engines: list[h.Engine], model: Path
) -> None:
    e = engine(engines, model, extra(32))
    adapter = e.manager
    ctx = ReqContext("r")
    rng = random.Random(14)
    keys = [make_offload_key(rng.randbytes(32), g) for g in (0, 1) for _ in range(5)]
    with adapter.lock:
        adapter.on_new_request(ctx)
        out = adapter.prepare_store(keys, ctx)
        assert out is not None and out.keys_to_store == keys
        m = adapter.kvtiers_manager
        assert list(out.store_spec.block_ids) == [m.slot_of(k) for k in keys]
        adapter.complete_store(set(keys), ctx)
        shuffled = keys[::-1]
        spec = adapter.prepare_load(shuffled, ctx)
        assert list(spec.block_ids) == [m.slot_of(k) for k in shuffled]
        adapter.complete_load(shuffled, ctx)
        # A key already present is skipped; the new ones keep their order.
        more = [make_offload_key(rng.randbytes(32), 0) for _ in range(3)]
        out = adapter.prepare_store([more[0], keys[2], more[1], more[2]], ctx)
        assert out is not None and out.keys_to_store == more
        assert list(out.store_spec.block_ids) == [m.slot_of(k) for k in more]
    assert adapter.lock is m.lock


def test_preemption_keeps_every_reloaded_page_right(
    engines: list[h.Engine], model: Path, tmp_path: Path
) -> None:
    # 16 GPU blocks for 2 requests of 6 blocks that each grow by 3: vLLM preempts
    # one, and it resumes from what kvtiers kept.
    e = engine(engines, model, extra(64, tmp_path / "fs"), num_blocks=16)
    rng = random.Random(15)
    prompts = [tokens(rng, 6) for _ in range(2)]
    requests = [e.add(f"r{i}", p, 3 * h.BLOCK) for i, p in enumerate(prompts)]
    drive(e)
    assert sum(r.num_preemptions for r in requests) > 0
    # What the preempted request's store jobs wrote (vLLM flushes them at the
    # preemption) is what the model wrote.
    assert e.scheduler.reset_prefix_cache()
    for i, p in enumerate(prompts):
        e.add(f"again{i}", p + tokens(rng, 1), 2)
        drive(e)
    assert e.pages_checked >= 12
    assert pool(e)["pool"]["pinned"] == 0


def test_reset_cache_empties_the_pool_and_fences_transfers_in_flight(
    engines: list[h.Engine], model: Path
) -> None:
    e = engine(engines, model, extra(64))
    rng = random.Random(16)
    prompt = tokens(rng, 6)
    e.add("first", prompt, 2)
    # Step until the scheduler has handed out the store job, not yet reported.
    for _ in range(20):
        e.step()
        if e.manager._stores:
            break
    assert e.manager._stores, "no store in flight"
    in_flight = set(e.manager._stores)
    e.scheduler.reset_connector_cache()  # as a weight update does
    assert e.manager._fenced == in_flight
    stats = pool(e)
    assert stats["pool"]["resident"] == len(in_flight)  # held until the fence lifts
    drive(e)
    assert e.manager._fenced is None
    e.settle()
    stats = pool(e)
    assert stats["pool"]["pinned"] == 0
    # Nothing stored before the reset is served after it.
    assert e.scheduler.reset_prefix_cache(reset_connector=True)
    e.add("again", prompt, 2)
    results = drive(e)
    assert loaded(results) == 0
    assert pool(e)["pool"]["stored_blocks"] >= 6


# --------------------------------------------------------------------- events, metrics


def test_events_name_stored_and_removed_blocks_of_each_tier(
    engines: list[h.Engine], model: Path, tmp_path: Path
) -> None:
    cfg = extra(12, tmp_path / "fs")
    # An fs tier of 8 blocks: it evicts too, and says so.
    cfg["secondary_tiers"][0]["capacity_bytes"] = 8 * CHUNK
    e = engine(engines, model, cfg, enable_events=True)
    events = record(e.connector, "take_events", flatten=True)
    rng = random.Random(17)
    for i in range(3):
        e.add(f"r{i}", tokens(rng, 6), 2)
        drive(e)
    stored = [ev for ev in events if isinstance(ev, BlockStored)]
    removed = [ev for ev in events if isinstance(ev, BlockRemoved)]
    assert {ev.medium for ev in stored} == {"CPU", "STORAGE"}
    assert {ev.medium for ev in removed} >= {"CPU", "STORAGE"}
    assert {ev.ownership for ev in removed if ev.medium == "STORAGE"} == {"fs"}
    n_stored_cpu = sum(len(ev.block_hashes) for ev in stored if ev.medium == "CPU")
    assert n_stored_cpu == pool(e)["pool"]["stored_blocks"] == 18
    n_removed_cpu = sum(len(ev.block_hashes) for ev in removed if ev.medium == "CPU")
    assert n_removed_cpu == pool(e)["pool"]["evictions"] == 6


def test_metrics_are_declared_and_count_what_happened(
    engines: list[h.Engine], model: Path, tmp_path: Path
) -> None:
    cfg = extra(32, tmp_path / "fs")
    e = engine(engines, model, cfg)
    payloads = record(e.connector, "get_kv_connector_stats")
    rng = random.Random(18)
    prompt = tokens(rng, 5)
    e.add("r", prompt, 2)
    drive(e)
    stats = OffloadingConnectorStats()
    for payload in payloads:  # what the scheduler sent, step by step
        if payload is not None:
            stats.aggregate(payload)
    defs = KvtiersOffloadingSpec.build_metric_definitions(cfg)
    types, values = stats.metric_sections()
    prefix = "vllm:kv_offload_kvtiers_"
    ours = {name for name in values if name.startswith(prefix)}
    assert ours and ours <= set(defs)
    for name in ours:
        kind = OffloadingCounterMetadata if types[name] == "counter" else OffloadingGaugeMetadata
        assert isinstance(defs[name], kind), name
        for labels in values[name]:
            assert len(labels) == len(defs[name].labelnames), name
    # Counters are sent as increments: summed, they are the manager's totals.
    assert values[prefix + "stored_blocks"][()] == 5 == pool(e)["pool"]["stored_blocks"]
    assert values[prefix + "tier_cascaded_blocks"][("fs",)] == 5
    assert values[prefix + "lookups"][()] == pool(e)["pool"]["lookups"]
    info = stats.data["info"]
    keys = set(KvtiersOffloadingSpec.config_info_keys(cfg))
    assert [row["tier"] for row in info] == ["cpu", "fs"]
    assert all(set(row) <= keys for row in info)


def test_class_methods_read_the_raw_config_without_vllms_tier_factory() -> None:
    cfg = {"spec_name": "KvtiersOffloadingSpec", "cpu_bytes_to_use": 1 << 30,
           "secondary_tiers": [{"type": "memory", "capacity_bytes": 1 << 20}]}  # fmt: skip
    with pytest.raises(ValueError):  # vLLM's own spec does not know kvtiers' tiers
        TieringOffloadingSpec.build_metric_definitions(copy.deepcopy(cfg))
    assert KvtiersOffloadingSpec.build_metric_definitions(cfg)
    assert "tier" in KvtiersOffloadingSpec.config_info_keys(cfg)
    found = OffloadingSpecFactory.get_spec_cls(
        {"spec_name": "KvtiersOffloadingSpec", "spec_module_path": "kvtiers_vllm.spec"}
    )
    assert found is KvtiersOffloadingSpec


# --------------------------------------------------------------------- configs


def test_the_seed_config_is_accepted_for_its_machine() -> None:
    cfg = load_config(copy.deepcopy(PR46216_KVTIERS), check_machine=False)
    [tier] = cfg.secondary_tiers
    assert tier.type == "fs" and tier.options["root_dir"] == "/mnt/nvme_storage"
    assert cfg.source_format == "vllm_kv_transfer_config" and cfg.warnings == ()
    assert cfg.cpu_bytes_to_use == 400 << 30 and cfg.eviction_policy == "lru"
    assert any(".capacity_bytes: not set" in n for n in cfg.notes)


def test_the_seed_config_runs_here_with_a_derived_fs_capacity(
    engines: list[h.Engine], model: Path, tmp_path: Path
) -> None:
    cfg = copy.deepcopy(PR46216_KVTIERS["kv_connector_extra_config"])
    cfg.update(spec_name=SPEC, spec_module_path=h.SPEC_MODULE, cpu_bytes_to_use=32 * CHUNK)
    cfg["secondary_tiers"][0]["root_dir"] = str(tmp_path)
    e = engine(engines, model, cfg)
    capacity = pool(e)["tiers"]["fs"]["capacity_bytes"]
    assert isinstance(capacity, int) and capacity > 0  # derived from the free space
    rng = random.Random(19)
    e.add("r", tokens(rng, 4), 2)
    drive(e)
    assert pool(e)["tiers"]["fs"]["cascaded_blocks"] == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"secondary_tiers": [{"type": "fss", "root_dir": "/tmp"}]}, "did you mean"),
        ({"eviction_policy": "lruu"}, "eviction_policy"),
        ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use"),
        ({"kvtiers_worker": "cuda"}, "kvtiers_worker"),
        ({"write_policy": "write_around"}, "write_policy"),
    ],
)
def test_wrong_configs_fail_with_a_clear_error(
    model: Path, change: dict[str, Any], message: str
) -> None:
    cfg = extra(16)
    cfg.update(change)
    with pytest.raises(ValueError, match=message):
        h.Engine(model, cfg).close()


# --------------------------------------------------------------------- kvtiers' worker

REGION_LOGGER = "vllm.v1.kv_offload.cpu.shared_offload_region"


def kept_mapped(caplog: pytest.LogCaptureFixture) -> list[str]:
    """vLLM's warning that a region could not be unmapped (a view still exported)."""
    return [r.getMessage() for r in caplog.records if "mapped" in r.getMessage()]


def _canonical(gpu: list[Any], groups: list[list[int]]) -> Any:
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )

    return CanonicalKVCaches(
        [CanonicalKVCacheTensor(t, t.shape[1]) for t in gpu],
        [[CanonicalKVCacheRef(i, gpu[i].shape[1]) for i in refs] for refs in groups],
    )


def _region(engine_id: str, chunks: int, row: int) -> Any:
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    return SharedOffloadRegion(engine_id, chunks, 0, row, row)


def _finished(worker: Any, n: int) -> list[Any]:
    done: list[Any] = []
    for _ in range(2000):
        done += worker.get_finished()
        if len(done) >= n:
            return done
        time.sleep(0.001)
    raise AssertionError(f"{len(done)} of {n} jobs finished")


def test_kvtiers_worker_writes_vllms_chunk_layout_byte_for_byte(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import numpy as np
    import torch
    from kvtiers_vllm.worker import KvtiersSwapWorker
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    blocks, chunks, row = 32, 16, h.PAGE * h.LAYERS
    gen = torch.Generator().manual_seed(20)
    gpu = [torch.randint(-128, 128, (blocks, h.PAGE), dtype=torch.int8, generator=gen)
           for _ in range(h.LAYERS)]  # fmt: skip
    caches = _canonical(gpu, [list(range(h.LAYERS))] * 2)  # two groups, one allocation
    ids = [h.new_engine_id(), h.new_engine_id()]
    ref_region, region = _region(ids[0], chunks, row), _region(ids[1], chunks, row)
    ours = None
    try:
        views = [ref_region.create_next_worker_view(h.PAGE) for _ in range(h.LAYERS)]
        reference = h.MemcpyWorker(caches, 1, views)  # vLLM's block -> chunk mapping
        ours = KvtiersSwapWorker(caches, region, 1, rank=0, world_size=1)
        src = GPULoadStoreSpec([3, 7, 9, 1, 2], group_sizes=[3, 2], block_indices=[0, 4])
        dst = CPULoadStoreSpec([5, 0, 11, 2, 8])
        for worker in (reference, ours):  # as the installed vLLM's connector passes it
            assert worker.submit_store(1, device_side(src, caches), dst)
        [result] = _finished(ours, 1)
        assert result.job_id == 1 and result.success and result.transfer_size == 5 * row
        mine, theirs = region.base_tensor.numpy(), ref_region.base_tensor.numpy()
        assert np.count_nonzero(theirs) > 0.9 * 5 * row
        assert np.array_equal(mine, theirs)
        # And back: the chunks land in other GPU blocks, byte for byte.
        for t in gpu:
            t.zero_()
        back = GPULoadStoreSpec([10, 11, 12, 13, 14], group_sizes=[3, 2], block_indices=[0, 4])
        assert ours.submit_load(2, dst, device_side(back, caches))
        _finished(ours, 1)
        for i, t in enumerate(gpu):
            for block, chunk in zip([10, 11, 12, 13, 14], [5, 0, 11, 2, 8], strict=True):
                assert np.array_equal(t[block].numpy(), views[i][chunk].numpy())
        del mine, theirs, views, reference  # this test's own views of the regions
    finally:
        with caplog.at_level(logging.WARNING, logger=REGION_LOGGER):
            if ours is not None:
                ours.shutdown()  # drops the swapper's views, then unmaps
            else:
                region.cleanup()
            ref_region.cleanup()
        for engine_id in ids:
            h.remove_shm(engine_id)
    assert not kept_mapped(caplog)


@pytest.mark.parametrize("groups", [1, 2])
def test_kvtiers_worker_through_vllms_connector_round_trip(
    engines: list[h.Engine], model: Path, groups: int
) -> None:
    """`"kvtiers_worker": "kvtiers"` under the installed vLLM's real connector (vLLM
    0.34 hands it device pointers, 0.33 block ids): a prompt stored through it, the
    GPU prefix cache reset and the "GPU" zeroed, comes back through it: the again
    request computes only its tail, and every page before it holds, byte for byte,
    what the model wrote."""
    cfg = {
        "spec_name": "KvtiersOffloadingSpec", "spec_module_path": "kvtiers_vllm.spec",
        "cpu_bytes_to_use": 32 * CHUNK, "kvtiers_worker": "kvtiers",
    }  # fmt: skip
    e = engine(engines, model, cfg, groups=groups)
    rng = random.Random(70 + groups)
    prompt = tokens(rng, PROMPT_BLOCKS)
    e.add("first", prompt, 2)
    drive(e)
    assert pool(e)["pool"]["stored_blocks"] >= PROMPT_BLOCKS
    assert e.scheduler.reset_prefix_cache()
    for t in e.gpu:
        t.zero_()
    e.add("again", prompt + tokens(rng, 1), 2)
    computed, blocks = None, None
    for _ in range(400):
        out = e.step().output
        if computed is None and "again" in out.num_scheduled_tokens:
            computed, blocks = out.num_scheduled_tokens["again"], e._blocks("again")
        if not e.scheduler.requests:
            break
        time.sleep(0.002)
    assert computed is not None and blocks is not None
    # vLLM recomputes a tail (a block per group here); every page before it was
    # zero on the "GPU" and can only have come back through kvtiers' worker.
    from_load = (len(prompt) + 1 - computed) // h.BLOCK
    assert from_load >= PROMPT_BLOCKS - groups
    checked = 0
    for g, ids in enumerate(blocks):
        for i, block in enumerate(ids[:from_load]):
            if block == 0:
                continue  # the null block: outside a sliding window
            for layer in range(h.LAYERS):
                want = h.page_bytes(prompt, (i + 1) * h.BLOCK, g, layer)
                assert np.array_equal(e.gpu[layer][block].numpy(), want), (g, i, layer)
            checked += 1
    assert checked >= from_load


@pytest.mark.parametrize(
    ("groups", "pages", "per_chunk", "message"),
    [
        ([[0, 1]], [h.PAGE, h.PAGE], 2, "one GPU block per CPU chunk"),
        ([[0, 1], [2, 3]], [h.PAGE] * 4, 1, "must be the first tensors"),
        ([[1, 0]], [h.PAGE, h.PAGE], 1, "must be the first tensors"),
        ([[0, 1]], [h.PAGE, h.PAGE // 2], 1, "equal, unpadded pages"),
    ],
)
def test_kvtiers_worker_refuses_a_layout_it_cannot_reproduce(
    groups: list[list[int]], pages: list[int], per_chunk: int, message: str
) -> None:
    import torch
    from kvtiers_vllm.worker import KvtiersSwapWorker, LayoutRefused

    gpu = [torch.ones(8, p, dtype=torch.int8) for p in pages]
    engine_id = h.new_engine_id()
    region = _region(engine_id, 4, -(-sum(pages) * per_chunk // 4096) * 4096)
    try:
        with pytest.raises(LayoutRefused, match=message) as info:
            KvtiersSwapWorker(_canonical(gpu, groups), region, per_chunk)
        assert '"kvtiers_worker": "vllm"' in str(info.value)
    finally:
        region.cleanup()
        h.remove_shm(engine_id)
