"""The replay in-process: the engine protocol keeps the books straight, and a block
whose pool copy is damaged behind everyone's back stops the run with its key."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kvtiers.bench.engine import pages_for
from kvtiers.bench.presets import geometry_from
from kvtiers.bench.runner import Replay
from kvtiers.bench.stack import BenchIntegrityError, Stack, build_stack
from kvtiers.bench.workload import WorkloadSpec
from kvtiers.config import load_config

from .conftest import small_pool

SPEC = WorkloadSpec(
    num_prefixes=3,
    prefix_tokens=96,
    prompt_tokens=32,
    output_tokens=32,
    turns=3,
    sessions_in_flight=3,
    total_sessions=12,
    block_tokens=16,
)


def _stack(tiers: list[dict[str, Any]] | None = None, slots: int = 64) -> Stack:
    config = load_config({"cpu_bytes_to_use": small_pool(slots), "secondary_tiers": tiers or []})
    pages = pages_for(3, 96, 32, 32, 3, 16)
    return build_stack(config, geometry_from("tiny"), pages, device=torch.device("cpu"))


def test_every_prompt_token_is_served_or_recomputed_and_every_load_verified() -> None:
    stack = _stack([{"type": "memory", "capacity_bytes": 16 << 20}], slots=24)
    try:
        result = Replay(stack, SPEC, label="t").run()
        assert stack.manager is not None
        stack.manager.drain(10)  # cascades and late promotions end
        pinned = stack.manager.stats()["pool"]["pinned"]
    finally:
        stack.close()
    assert pinned == 0  # every prepare_load/prepare_store was completed
    c = result.counters
    assert c.requests == SPEC.requests
    assert sum(c.served_tokens.values()) + c.recomputed_tokens == c.prompt_tokens
    assert c.served_tokens.get("memory", 0) > 0  # the pool is too small: promotions serve
    assert c.verified_blocks == sum(c.served_blocks.values())
    assert stack.kv.pages.free == stack.kv.num_pages  # every page came back


def test_the_figures_count_every_copy_the_run_queued_however_late_the_tier() -> None:
    """A tier slower than the whole run (every store held 0.3 s) still has every
    copy the run sent down counted: the run lets the tiers finish before its
    figures are taken (a short run on a busy disk reported 0 bytes written)."""
    lagging = {"type": "faulty", "latency_s": 0.3, "ops": ["store"],
               "inner": {"type": "memory", "capacity_bytes": 16 << 20}}
    stack = _stack([lagging], slots=24)
    try:
        result = Replay(stack, SPEC, label="t").run()
        assert stack.manager is not None
        assert stack.manager.idle()  # nothing left in flight or queued
    finally:
        stack.close()
    assert result.manager_stats is not None
    tier = result.manager_stats["tiers"]["faulty"]
    assert tier["cascaded_blocks"] > 0
    assert tier["bytes_written"] == tier["cascaded_blocks"] * stack.kv.content.block_bytes
    assert result.tiers()["faulty"]["bytes_written"] == tier["bytes_written"]
    assert result.settled and result.settle_s > 0
    assert result.as_dict()["settle"] == {"seconds": result.settle_s, "finished": True}


def test_a_tier_that_never_finishes_ends_the_wait_with_settled_false() -> None:
    """Stores that hang: the run still ends, after `max_wait_s`, and says its
    figures miss what was in flight."""
    hanging = {"type": "faulty", "hang_rate": 1.0, "ops": ["store"],
               "inner": {"type": "memory", "capacity_bytes": 16 << 20}}
    stack = _stack([hanging], slots=24)
    try:
        result = Replay(stack, SPEC, label="t", max_wait_s=0.6).run()
    finally:
        stack.close()
    assert not result.settled and result.settle_s >= 0.6
    assert result.counters.requests == SPEC.requests


def test_no_offloading_recomputes_everything() -> None:
    geo = geometry_from("tiny")
    stack = build_stack(None, geo, pages_for(3, 96, 32, 32, 3, 16), device=torch.device("cpu"))
    result = Replay(stack, SPEC, label="none").run()
    stack.close()
    assert result.counters.recomputed_tokens == result.counters.prompt_tokens > 0
    assert result.hit_rate() == 0


def test_a_pool_slot_damaged_behind_the_managers_back_stops_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = _stack()
    assert stack.pool is not None and stack.manager is not None
    manager, slots = stack.manager, stack.pool.tensor()
    replay = Replay(stack, SPEC, label="t")
    original = replay._admit

    def admit(live: Any, n: int, **kw: Any) -> None:  # flip a byte of the first hit's slot
        if n:
            slot = manager.slot_of(live.req.prompt_keys[0])
            slots[slot, 100] ^= 0xFF
        original(live, n, **kw)

    monkeypatch.setattr(replay, "_admit", admit)
    try:
        with pytest.raises(BenchIntegrityError, match="was stored there from the GPU by this run"):
            replay.run()
    finally:
        stack.close()
