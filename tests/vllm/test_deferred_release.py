"""vLLM 0.34's deferred release at level 1: a kvtiers tier under vLLM's
`TieringOffloadingSpec` whose promotion is still running at its deadline
(`job_timeout_s`) is reported failed at once, so that the request recomputes
instead of waiting, and hands vLLM an event: vLLM keeps the promotion's CPU chunks
out of its free pool until the tier's I/O into them has ended (the event is set),
also across `reset_cache`. On vLLM 0.33, which has no deferred release, the tier
reports such a promotion only once its reads ended: the request waits. Through
vLLM's real scheduler on CPU (tests/vllm/harness.py); every page loaded is checked
byte for byte.

The tier that "fails while still writing" is kvtiers' fs tier whose loads run only
when the test opens a gate, and then to the end (as a read already under way at its
deadline would): its reads into vLLM's chunks run after vLLM was told the promotion
failed. Its `drain` waits for them, as a real tier's does."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from kvtiers_vllm.compat import results

from . import harness
from .conftest import MakeEngine
from .gated_tier import Gate
from .test_tier import extra_config, kvtiers_entry, kvtiers_tier, prompt

deferred_release = pytest.mark.skipif(
    not results.DEFERRED_RELEASE, reason="this vLLM has no JobResult.deferred_release (0.33)"
)


def stored_then_only_in_fs(engine: harness.Engine, tokens: list[int]) -> int:
    """Run `tokens` (stored down to fs), then empty the GPU cache and vLLM's CPU
    tier: only the kvtiers tier holds the blocks. Returns how many."""
    engine.add("first", tokens, max_tokens=1)
    engine.run()
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    engine.settle()
    blocks = len(tokens) // harness.BLOCK
    assert kvtiers_tier(engine).tier.stats().blocks_written == blocks
    return blocks


def deferred_chunks(engine: harness.Engine) -> int:
    """vLLM's count of CPU chunks held for failed promotions."""
    return int(engine.manager.primary_tier.num_deferred_release_chunks)


@deferred_release
def test_a_promotion_past_its_deadline_fails_at_once_and_vllm_holds_its_chunks(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    entry = kvtiers_entry(tmp_path / "fs", job_timeout_s=0.05)
    engine = make_engine(extra_config([entry]), num_blocks=16)
    tier = kvtiers_tier(engine)
    tokens = prompt(random.Random(31))
    blocks = stored_then_only_in_fs(engine, tokens)
    gate = Gate(tier.tier)
    read_before = tier.tier.stats().blocks_read

    # The promotion is submitted, never starts, passes its deadline: the request
    # finishes by recomputing, while vLLM holds the promotion's chunks.
    engine.add("again", tokens, max_tokens=1)
    loaded = sum(r.loaded_pages for r in engine.run(settle=False))
    assert gate.submitted == 1 and loaded == 0
    assert tier.releases_pending == 1 and deferred_chunks(engine) == blocks

    # The tier's reads now run into those chunks; once it reports, the event is set
    # and vLLM frees them.
    gate.open()
    engine.settle()
    assert tier.tier.stats().blocks_read - read_before == blocks  # it did write them
    assert tier.releases_pending == 0 and deferred_chunks(engine) == 0
    assert not tier.has_pending_work()

    # The blocks are still the tier's, and come back byte-identical (the GPU cache
    # and vLLM's CPU tier emptied first).
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    engine.settle()
    read_before = tier.tier.stats().blocks_read
    engine.add("third", tokens, max_tokens=1)
    assert sum(r.loaded_pages for r in engine.run()) == blocks == engine.pages_checked
    assert tier.tier.stats().blocks_read - read_before == blocks


@deferred_release
def test_reset_cache_waits_for_the_late_reads_and_sets_every_event(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    """vLLM's reset_cache with a deferred release pending: the tier's drain_jobs
    waits for its reads and sets the event before it returns (vLLM asserts that no
    deferred release is left), and the pool is whole again after."""
    entry = kvtiers_entry(tmp_path / "fs", job_timeout_s=0.05)
    engine = make_engine(extra_config([entry]), num_blocks=16)
    tier = kvtiers_tier(engine)
    tokens = prompt(random.Random(32))
    blocks = stored_then_only_in_fs(engine, tokens)
    gate = Gate(tier.tier)
    engine.add("again", tokens, max_tokens=1)
    engine.run(settle=False)
    assert deferred_chunks(engine) == blocks and not gate.opened.is_set()
    pending_after_drain: list[int] = []  # vLLM's contract: every event set by then
    drain = tier.drain_jobs

    def checked_drain() -> None:
        drain()
        pending_after_drain.append(tier.releases_pending)

    tier.drain_jobs = checked_drain  # type: ignore[method-assign]
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    assert gate.opened.is_set() and pending_after_drain == [0]
    assert deferred_chunks(engine) == 0
    engine.settle()
    assert not tier.has_pending_work()
    engine.add("third", tokens, max_tokens=1)
    assert sum(r.loaded_pages for r in engine.run()) == blocks == engine.pages_checked


@pytest.mark.skipif(results.DEFERRED_RELEASE, reason="this vLLM defers the release (0.34)")
def test_without_deferred_release_a_late_promotion_is_reported_when_its_reads_end(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    """vLLM 0.33 has no deferred release: a promotion reported failed would have its
    CPU chunks reused while the tier's reads may still write them. So past its
    deadline the tier still reports nothing: the request waits for the read, which
    lands and loads byte for byte once the tier's I/O runs."""
    entry = kvtiers_entry(tmp_path / "fs", job_timeout_s=0.05)
    engine = make_engine(extra_config([entry]), num_blocks=16)
    tier = kvtiers_tier(engine)
    tokens = prompt(random.Random(33))
    blocks = stored_then_only_in_fs(engine, tokens)
    gate = Gate(tier.tier)
    engine.add("again", tokens, max_tokens=1)
    waited = []
    for _ in range(40):  # 40 steps of >= 5 ms: well past the 50 ms deadline
        waited.append(engine.step())
        time.sleep(0.005)
    assert gate.submitted == 1 and engine.scheduler.requests  # waiting, not failed
    assert sum(r.loaded_pages for r in waited) == 0 and tier.has_pending_work()
    gate.open()
    loaded = sum(r.loaded_pages for r in engine.run())
    assert loaded == blocks == engine.pages_checked
