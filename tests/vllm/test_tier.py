"""kvtiers tiers under vLLM's own offloading (level 1), through vLLM's real Scheduler
and OffloadingConnector on CPU (tests/vllm/harness.py).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import logging
import random
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtiers import key_group
from kvtiers.contract.keys import key_hash
from kvtiers_vllm import tier_metrics
from kvtiers_vllm.plugin import SPEC_NAME, TIER_TYPE, register
from kvtiers_vllm.tier import KvtiersTier
from kvtiers_vllm.tier_config import TierConfigError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
from vllm.v1.kv_offload.base import LookupResult, Medium, make_offload_key
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.request import RequestStatus

from . import harness
from .conftest import MakeEngine

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


def test_two_kv_cache_groups_by_module_path(make_engine: MakeEngine, tmp_path: Path) -> None:
    """A hybrid model (full attention + a sliding window), the tier named by class and
    module path (no entry point needed): keys of both groups go to fs and come back,
    byte-identical, after a cache reset emptied the GPU prefix cache and vLLM's CPU
    tier."""
    entry = kvtiers_entry(tmp_path / "fs", type="KvtiersTier", module_path="kvtiers_vllm.tier")
    engine = make_engine(extra_config([entry]), num_blocks=32, groups=2)
    tier = kvtiers_tier(engine)
    tokens = prompt(random.Random(3))
    first = engine.add("first", tokens, max_tokens=2)
    engine.run()
    held = set().union(*(ns.keys() for ns in tier.tier.inventory().namespaces))
    full = len(tokens) // harness.BLOCK
    assert {make_offload_key(h, 0) for h in first.block_hashes[:full]} <= held
    window = {k for k in held if key_group(k) == 1}
    assert window and window <= {make_offload_key(h, 1) for h in first.block_hashes[:full]}
    assert len(held) == full + len(window)
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    engine.settle()
    engine.add("again", tokens, max_tokens=1)
    loaded = sum(r.loaded_pages for r in engine.run())
    assert loaded == len(held) and engine.pages_checked == loaded
    assert tier.tier.stats().blocks_read == len(held)


def test_chunks_of_two_blocks(make_engine: MakeEngine, tmp_path: Path) -> None:
    """vLLM's chunks of two GPU blocks (`blocks_per_chunk`): a kvtiers block is one
    chunk (the namespace says 32 tokens), and the round trip stays byte-identical."""
    extra = extra_config([kvtiers_entry(tmp_path / "fs")], cpu_chunks=16)
    extra["blocks_per_chunk"] = 2
    extra["cpu_bytes_to_use"] = 16 * 2 * CHUNK_BYTES
    engine = make_engine(extra, num_blocks=16)
    tier = kvtiers_tier(engine)
    assert [g.tokens_per_block for g in tier.namespace.groups] == [2 * harness.BLOCK]
    tokens = prompt(random.Random(13), 128)
    engine.add("first", tokens, max_tokens=1)
    engine.run()
    chunks = len(tokens) // (2 * harness.BLOCK)
    assert tier.tier.stats().blocks_written == chunks
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    engine.settle()
    engine.add("again", tokens, max_tokens=1)
    loaded = sum(r.loaded_pages for r in engine.run())
    assert tier.tier.stats().blocks_read == chunks
    assert loaded == engine.pages_checked and loaded >= 2 * chunks - 1


def test_another_kvtiers_tier_in_ram(make_engine: MakeEngine) -> None:
    """Any kvtiers tier, not only fs: the core's `memory` tier, declared a CPU medium
    (vLLM then counts its hits as host hits), round trip byte-identical."""
    entry = {
        "type": TIER_TYPE,
        "medium": "CPU",
        "tier": {"type": "memory", "capacity_bytes": 10**7},
    }
    engine = make_engine(extra_config([entry]), num_blocks=16, enable_events=True)
    tier = kvtiers_tier(engine)
    assert tier.medium is Medium.CPU and tier.cache_hit_source is CacheHitSource.HOST
    tokens = prompt(random.Random(17))
    engine.add("first", tokens, max_tokens=1)
    engine.run()
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    engine.settle()
    engine.add("again", tokens, max_tokens=1)
    blocks = len(tokens) // harness.BLOCK
    assert sum(r.loaded_pages for r in engine.run()) == blocks == engine.pages_checked
    assert tier.tier.stats().blocks_read == blocks
    mine = [e for e in engine.events if getattr(e, "ownership", None) == "kvtiers:memory"]
    assert mine and {e.medium for e in mine} == {"CPU"}


def test_reset_cache_drains_the_tier_and_keeps_its_blocks(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    """vLLM's reset_cache (sleep, weight update) with stores to the kvtiers tier still
    in flight: it waits for them (drain_jobs), the tier keeps what it stored, and a
    later request loads it back through a fresh CPU tier, byte-identical."""
    engine = make_engine(extra_config([kvtiers_entry(tmp_path / "fs")]), num_blocks=16)
    tier = kvtiers_tier(engine)
    drains: list[int] = []  # jobs in flight at each drain_jobs call
    drain = tier.drain_jobs

    def counting_drain() -> None:
        drains.append(tier.jobs_in_flight)
        drain()

    tier.drain_jobs = counting_drain  # type: ignore[method-assign]
    tokens = prompt(random.Random(9))
    engine.add("first", tokens, max_tokens=1)
    engine.run(settle=False)
    for _ in range(20):  # until the cascade to the tier is submitted
        if tier.jobs_in_flight:
            break
        engine.step()
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    assert drains and drains[0] > 0 and tier.jobs_in_flight == 0
    engine.settle()
    blocks = len(tokens) // harness.BLOCK
    assert tier.tier.stats().blocks_written == blocks
    engine.add("again", tokens, max_tokens=1)
    assert sum(r.loaded_pages for r in engine.run()) == blocks
    assert tier.tier.stats().blocks_read == blocks and engine.pages_checked == blocks


def test_preemption(make_engine: MakeEngine, tmp_path: Path) -> None:
    """Requests preempted for lack of GPU blocks (10 blocks, three growing requests)
    resume and finish; the blocks they load back (decode blocks offloaded too) are
    byte-identical."""
    extra = extra_config([kvtiers_entry(tmp_path / "fs")])
    extra["offload_prompt_only"] = False
    engine = make_engine(extra, num_blocks=10)
    rnd = random.Random(21)
    for i in range(3):
        engine.add(f"r{i}", prompt(rnd, 64), max_tokens=48)
    engine.run(max_steps=400)
    assert len(engine.preempted) >= 2
    assert engine.pages_checked > 0
    assert kvtiers_tier(engine).tier.stats().blocks_written > 0


def test_events_include_removals(make_engine: MakeEngine, tmp_path: Path) -> None:
    """With vLLM's KV events on, the tier reports blocks stored and blocks removed
    (its fs store is bounded: it evicts), under its own ownership; a router replaying
    the events ends with exactly what the tier holds."""
    cap_blocks = 4
    entry = kvtiers_entry(tmp_path / "fs", capacity=cap_blocks * harness_file_bytes())
    engine = make_engine(extra_config([entry]), num_blocks=16, enable_events=True)
    tier = kvtiers_tier(engine)
    rnd = random.Random(4)
    for i in range(3):
        engine.add(f"r{i}", prompt(rnd), max_tokens=1)
        engine.run()
    mine = [e for e in engine.events if getattr(e, "ownership", None) == tier.ownership]
    stored = [e for e in mine if isinstance(e, BlockStored)]
    removed = [e for e in mine if isinstance(e, BlockRemoved)]
    assert stored and removed
    view: set[tuple[int, Any]] = set()
    for event in mine:
        pairs = {(event.group_idx, h) for h in event.block_hashes}
        view = view | pairs if isinstance(event, BlockStored) else view - pairs
    held = set().union(*(ns.keys() for ns in tier.tier.inventory().namespaces))
    assert 0 < len(held) <= cap_blocks
    assert view == {(key_group(k), maybe_convert_block_hash(key_hash(k))) for k in held}
    assert {e.medium for e in mine} == {"STORAGE"}


def harness_file_bytes() -> int:
    """Bytes the fs tier spends per block of the harness's chunk."""
    layout = importlib.import_module("kvtiers_fs.disk.layout")
    return int(layout.file_bytes(CHUNK_BYTES))


def test_stats_and_metric_definitions(make_engine: MakeEngine, tmp_path: Path) -> None:
    """The tier's counters reach vLLM's connector stats (every step with
    `stats_interval_s` 0), under metric names the spec defines from the raw config
    (what vLLM's API server does), and vLLM's own Prometheus code accepts every
    payload."""
    extra = extra_config([kvtiers_entry(tmp_path / "fs", stats_interval_s=0)])
    engine = make_engine(extra, num_blocks=16)
    tier = kvtiers_tier(engine)
    tokens = prompt(random.Random(2))
    engine.add("first", tokens, max_tokens=1)
    engine.run()
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    engine.settle()
    engine.add("again", tokens, max_tokens=1)
    engine.run()
    blocks = len(tokens) // harness.BLOCK

    definitions = TieringOffloadingSpec.build_metric_definitions(extra)
    assert set(tier_metrics.definitions()) <= set(definitions)
    label = (tier.tier_label,)
    assert label == ("1:kvtiers",)

    def total(name: str) -> float:
        return float(sum(p["data"].get(name, {}).get(label, 0) for p in engine.stats))

    assert total(tier_metrics.PREFIX + "blocks_written") == blocks
    assert total(tier_metrics.PREFIX + "blocks_read") == blocks
    assert total(tier_metrics.PREFIX + "read_bytes") == tier.tier.stats().bytes_read > 0

    registry = CollectorRegistry()
    types = {
        Counter: functools.partial(Counter, registry=registry),
        Gauge: functools.partial(Gauge, registry=registry),
        Histogram: functools.partial(Histogram, registry=registry),
    }
    prom = OffloadingConnector.build_prom_metrics(engine.config, types, ["engine"], {0: ["0"]})
    for payload in engine.stats:
        prom.observe(payload, 0)
    value = registry.get_sample_value(
        tier_metrics.PREFIX + "blocks_read_total", {"engine": "0", "tier": "1:kvtiers"}
    )
    assert value == blocks
    usage = registry.get_sample_value(tier_metrics.USAGE, {"engine": "0", "tier": "1:kvtiers"})
    assert usage == tier.tier.stats().usage_bytes > 0


def test_stats_come_at_most_every_stats_interval(make_engine: MakeEngine, tmp_path: Path) -> None:
    """vLLM asks for the tier's stats every scheduler step; with an interval, only the
    first ask in each interval carries the tier's counters (the rest are None), and
    nothing is lost: the next payload carries what changed meanwhile."""
    extra = extra_config([kvtiers_entry(tmp_path / "fs", stats_interval_s=3600)])
    engine = make_engine(extra, num_blocks=16)
    tier = kvtiers_tier(engine)
    assert tier.options.stats_interval_s == 3600
    tokens = prompt(random.Random(3))
    engine.add("first", tokens, max_tokens=1)
    engine.run()
    label = (tier.tier_label,)
    ours = set(tier_metrics.definitions())
    carrying = [p for p in engine.stats
                if any(label in v for name, v in p["data"].items() if name in ours)]
    assert len(carrying) <= 1  # the first ask, at the first step
    assert tier.tier.stats().blocks_written > 0
    assert tier.get_stats() is None  # still inside the interval
    tier._next_stats = 0.0  # the interval is over
    payload = tier.get_stats()
    assert payload is not None
    written = payload.data["data"][tier_metrics.PREFIX + "blocks_written"][label]
    assert written == tier.tier.stats().blocks_written


def test_namespace_is_vllm_run_identity(
    make_engine: MakeEngine, model_dir: Path, tmp_path: Path
) -> None:
    """The tier's namespace is vLLM's model and run identity: its revision is the digest
    that names vLLM's own fs directory for the same run; another layout (two groups)
    is another namespace."""
    from vllm.v1.kv_offload.file_mapper import FileMapper

    one = kvtiers_tier(make_engine(extra_config([kvtiers_entry(tmp_path / "a")])))
    two = kvtiers_tier(make_engine(extra_config([kvtiers_entry(tmp_path / "b")]), groups=2))
    assert one.namespace.model == two.namespace.model == str(model_dir)
    spec = one._offloading_spec
    mapper = FileMapper.from_offloading_spec(
        str(tmp_path), spec, blocks_per_file=spec.blocks_per_chunk, parallel_agnostic=True
    )
    digest = one.namespace.revision.removeprefix("vllm-run-")
    assert len(digest) == 12 and mapper.base_path.endswith("_" + digest)
    assert one.namespace.fingerprint != two.namespace.fingerprint
    assert len(two.namespace.groups) == 2
    assert one.config_info() == {
        "kvtiers_tier": "fs",
        "kvtiers_namespace": one.namespace.fingerprint,
    }


# --- wrong configs -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"type": "kvtiers"}, r"secondary_tiers\[0\]\.tier: kvtiers tier: missing \"tier\""),
        ({"type": "kvtiers", "tier": "fs"}, r"secondary_tiers\[0\]\.tier: .*expected an object"),
        ({"type": "kvtiers", "tier": {"root_dir": "/x"}}, r"secondary_tiers\[0\]\.tier\.type: "),
        (
            {"type": "kvtiers", "tier": {"type": "nvme"}},
            r"secondary_tiers\[0\]\.tier\.type: .*'nvme'.*\bfs\b.*\bmemory\b",
        ),
        (
            {
                "type": "kvtiers",
                "tier": {"type": "fs", "root_dir": "ROOT", "capacity_bytes": "lots"},
            },
            r"secondary_tiers\[0\]\.tier\.capacity_bytes: expected an integer >= 1, "
            r'found "lots"',
        ),
        (
            {
                "type": "kvtiers",
                "medium": "TAPE",
                "tier": {"type": "memory", "capacity_bytes": 10**6},
            },
            r"secondary_tiers\[0\]\.medium: kvtiers tier: expected one of STORAGE, CPU, got 'TAPE'",
        ),
        (
            {"type": "kvtiers", "job_timeout_s": 0, "tier": {"type": "memory"}},
            r"secondary_tiers\[0\]\.job_timeout_s: kvtiers tier: expected a number of "
            r"seconds > 0, got 0",
        ),
        (
            {"type": "kvtiers", "stats_interval_s": -1, "tier": {"type": "memory"}},
            r"secondary_tiers\[0\]\.stats_interval_s: kvtiers tier: expected a number of "
            r"seconds >= 0, got -1",
        ),
    ],
)
def test_wrong_configs_fail_clearly(
    make_engine: MakeEngine, tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    tier = entry.get("tier")
    if isinstance(tier, dict) and tier.get("root_dir") == "R":
        tier["root_dir"] = str(tmp_path)
    with pytest.raises(TierConfigError, match=message) as info:
        make_engine(extra_config([entry]))
    assert isinstance(info.value, ValueError)  # what vLLM's own factories raise


def test_unknown_keywords_are_ignored_with_a_warning(
    make_engine: MakeEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What a later vLLM may pass (vllm#58087 added a keyword every tier had to take),
    or a vLLM fs option left in the entry: a warning naming it, nothing more."""
    entry = kvtiers_entry(tmp_path / "fs", n_read_threads=8, some_future_kwarg=1)
    with caplog.at_level(logging.WARNING, logger="kvtiers_vllm.tier"):
        engine = make_engine(extra_config([entry]))
    assert isinstance(kvtiers_tier(engine), KvtiersTier)
    (record,) = [r for r in caplog.records if "does not know" in r.getMessage()]
    assert "n_read_threads, some_future_kwarg" in record.getMessage()


# --- the entry point -------------------------------------------------------------------


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
