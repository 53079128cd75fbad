"""The pool's recency at level 2 is request-scoped, as vLLM's own CPU cache policies
make it (on 0.33 and 0.34 alike): a load or a store that ends is no use of its
blocks (the pool's policy keeps pinned blocks in place); when a request finishes,
every block it loaded, offered or stored is refreshed in prefix order, its head
last, so that the head of a prefix is evicted after its tail; and a prefix the GPU's
cache served (offered again to the pool by vLLM) counts as used. Under eviction
pressure this decides whether a prefix comes back at all (a lookup stops at the
first missing block).

Each scenario runs through vLLM's real scheduler on CPU twice: with vLLM's own
`CPUOffloadingSpec` and with `KvtiersOffloadingSpec` (no secondary tier), the same
eviction policy, pool size and requests: kvtiers must load as many blocks as vLLM,
each page byte for byte what the model wrote (checked by the harness)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtiers_vllm.spec import KvtiersOffloadingSpec
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from tests.vllm import harness as h
from tests.vllm.test_spec import CHUNK, drive, loaded, tokens
from tests.vllm.trace import Trace, run_trace

KVTIERS = "RecencyKvtiersSpec"
h.cpu_worker_spec(KvtiersOffloadingSpec, KVTIERS)
VLLM_CPU = "RecencyVllmCpuSpec"
h.cpu_worker_spec(CPUOffloadingSpec, VLLM_CPU)
SLOTS = 12


def config(spec: str, slots: int = SLOTS, policy: str = "lru") -> dict[str, Any]:
    return {"spec_name": spec, "spec_module_path": h.SPEC_MODULE,
            "cpu_bytes_to_use": slots * CHUNK, "eviction_policy": policy,
            "offload_prompt_only": False}  # fmt: skip


def evicted_tail_first(e: h.Engine) -> int:
    """A prompt of 8 blocks, then another of 8: the pool (12 slots) keeps 4 of the
    first. Head-last recency keeps its head, so its prefix comes back: 4 blocks."""
    rng = random.Random(60)
    first = tokens(rng, 8)
    e.add("first", first, 2)
    drive(e)
    e.add("second", tokens(rng, 8), 2)
    drive(e)
    assert e.scheduler.reset_prefix_cache()
    e.add("again", first + tokens(rng, 1), 2)
    return loaded(drive(e))


def reuse_from_the_gpu_counts(e: h.Engine) -> int:
    """A (6 blocks), then B (4), then C extends A while A is still in the GPU's cache
    (vLLM offers A's blocks to the pool again: a use), then D (6 new) evicts: B goes,
    A stays; A comes back whole."""
    rng = random.Random(61)
    a = tokens(rng, 6)
    e.add("a", a, 2)
    drive(e)
    e.add("b", tokens(rng, 4), 2)
    drive(e)
    e.add("c", a + tokens(rng, 1), 2)  # A's blocks: GPU prefix-cache hits
    drive(e)
    # vLLM tells the pool a request finished in the step after (with that step's
    # stores): a request shorter than a block (nothing to store) takes that step.
    e.add("short", [1] * (h.BLOCK // 2), 2)
    drive(e)
    e.add("d", tokens(rng, 6), 2)
    drive(e)
    assert e.scheduler.reset_prefix_cache()
    e.add("again", a + tokens(rng, 1), 2)
    return loaded(drive(e))


@pytest.mark.parametrize(
    ("scenario", "policy"),
    [
        (evicted_tail_first, "lru"),
        (reuse_from_the_gpu_counts, "lru"),
        # ARC: a reuse is a second use (T2); a store is not touched at all.
        (reuse_from_the_gpu_counts, "arc"),
    ],
)
def test_kvtiers_pool_keeps_what_vllms_policy_keeps(
    model_dir: Path, scenario: Callable[[h.Engine], int], policy: str
) -> None:
    got: dict[str, int] = {}
    for spec in (VLLM_CPU, KVTIERS):
        e = h.Engine(model_dir, config(spec, policy=policy))
        try:
            got[spec] = scenario(e)
            assert e.pages_checked == got[spec]
        finally:
            e.close()
    assert got[VLLM_CPU] > 0, got  # the scenario keeps part of a prefix
    assert got[KVTIERS] == got[VLLM_CPU], got


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("slots", [32, 48])
@pytest.mark.parametrize("concurrency", [1, 2, 4])
def test_a_multi_turn_trace_hits_at_least_as_often_as_vllms_policy(
    model_dir: Path, policy: str, slots: int, concurrency: int
) -> None:
    """The multi-turn trace of tests/vllm/trace.py, `concurrency` conversations at a
    time, in a pool of `slots` blocks (no secondary tier: what the pool keeps is all
    there is): kvtiers loads at least as many blocks as vLLM's CPU spec with the same
    policy, every one checked byte for byte (both runs are deterministic: the
    memcpy worker is synchronous and nothing runs on other threads). With several
    requests in flight, what a request has not finished yet must not outrank what
    finished requests used: a load's or a store's end is no use."""
    trace = Trace(sessions=8, concurrency=concurrency, turns=3, system_blocks=4, user_blocks=2)
    got: dict[str, int] = {}
    ideal = set()
    for spec in (VLLM_CPU, KVTIERS):
        e = h.Engine(model_dir, config(spec, slots, policy), num_blocks=256,
                     max_num_seqs=trace.concurrency, max_num_batched_tokens=2048)  # fmt: skip
        try:
            run = run_trace(e, trace)
        finally:
            e.close()
        assert run.pages_checked == run.loaded_blocks
        assert run.loaded_blocks <= run.ideal_blocks
        got[spec] = run.loaded_blocks
        ideal.add(run.ideal_blocks)
    assert len(ideal) == 1, ideal  # the same requests
    if slots == 32:  # under pressure: neither keeps everything
        assert 0 < got[VLLM_CPU] < ideal.pop(), got
    assert got[VLLM_CPU] > 0, got
    assert got[KVTIERS] >= got[VLLM_CPU], got
