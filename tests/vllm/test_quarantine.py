"""Level 2's answer to a promotion still "writing" past its deadline, on every
supported vLLM: kvtiers' manager (`KvtiersOffloadingSpec`) times the promotion out
at `job_timeout_s`, the request recomputes, and the promotion's pool slots stay
quarantined (neither free nor resident: nothing else is put there) until the tier
reports the job; then they are free again. A block whose promotion timed out is
still the tier's: it is promoted again, into other slots, while the stuck read's
slots stay quarantined. vLLM's deferred release (0.34, level 1) is not needed here:
the pool is kvtiers'. Through vLLM's real scheduler on CPU."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from tests.vllm import harness as h
from tests.vllm.gated_tier import Gate
from tests.vllm.test_spec import PROMPT_BLOCKS, drive, extra, pool, tokens


def quarantined(e: h.Engine) -> int:
    stats = pool(e)["pool"]
    return int(stats["num_slots"] - stats["free"] - stats["resident"])


def set_job_timeout(e: h.Engine, seconds: float) -> None:
    """The deadline of the tier jobs the manager submits from now on. The tests
    write with the default (a loaded machine may take longer than a short deadline
    to write, which would time the writes out too) and shorten it for the reads."""
    e.manager.kvtiers_manager._traffic._timeout = seconds


def test_a_late_promotion_quarantines_its_slots_until_the_tier_reports(
    model_dir: Path, tmp_path: Path
) -> None:
    e = h.Engine(model_dir, extra(16, tmp_path / "fs"))
    try:
        rng = random.Random(80)
        prompt = tokens(rng, PROMPT_BLOCKS)
        e.add("first", prompt, 2)
        drive(e)
        for i in range(3):  # push the first prompt out of the 16-slot pool: fs only
            e.add(f"other{i}", tokens(rng, PROMPT_BLOCKS), 2)
            drive(e)
        assert e.scheduler.reset_prefix_cache()
        (runtime,) = e.manager.kvtiers_manager._traffic.tiers
        gate = Gate(runtime.tier)
        assert quarantined(e) == 0
        set_job_timeout(e, 0.05)

        e.add("again", prompt + tokens(rng, 1), 2)
        results = e.run(settle=False)  # finishes: the promotion timed out, recomputed
        # Every promotion timed out (the manager may promote what is left of the
        # prompt again once the first timed out, into other slots), and each one's
        # slots are held: nothing else is put where a late read may still land.
        assert sum(r.loaded_pages for r in results) == 0 and gate.submitted >= 1
        # (the recomputed blocks' copies to fs may time out too on a loaded machine)
        assert pool(e)["tiers"]["fs"]["timeouts"] >= gate.submitted
        assert quarantined(e) == gate.blocks >= PROMPT_BLOCKS

        gate.open()  # the read lands in those slots; once reported, they are free
        e.settle()
        assert quarantined(e) == 0
        assert pool(e)["tiers"]["fs"]["promoted_hits"] == 0  # the late bytes unused

        assert e.scheduler.reset_prefix_cache()
        e.add("third", prompt + tokens(rng, 1), 2)
        assert sum(r.loaded_pages for r in drive(e)) == PROMPT_BLOCKS == e.pages_checked
    finally:
        e.close()


def test_a_block_whose_promotion_timed_out_is_promoted_again_from_fs(
    model_dir: Path, tmp_path: Path
) -> None:
    """The first promotion of the prompt is stuck past its deadline; the request's
    next lookups find the blocks in fs again and promote them into other slots,
    which land and load byte for byte, while the stuck promotion's slots stay
    quarantined. Once the tier reports the stuck read, its slots are free, and the
    blocks, dropped from the pool, come back from fs once more."""
    e = h.Engine(model_dir, extra(32, tmp_path / "fs"))
    try:
        rng = random.Random(81)
        prompt = tokens(rng, PROMPT_BLOCKS)
        e.add("first", prompt, 2)
        drive(e)
        # Only fs holds the prompt now: the pool and the GPU's cache are emptied.
        assert e.scheduler.reset_prefix_cache(reset_connector=True)
        e.settle()
        assert pool(e)["pool"]["resident"] == 0
        (runtime,) = e.manager.kvtiers_manager._traffic.tiers
        gate = Gate(runtime.tier, hold=1)
        # The held read gets a short deadline; later jobs the default again.
        set_job_timeout(e, 0.05)
        held_submit = runtime.tier.submit_load

        def first_one_short(job: Any) -> None:
            held_submit(job)
            set_job_timeout(e, 30.0)

        runtime.tier.submit_load = first_one_short

        e.add("again", prompt + tokens(rng, 1), 2)
        results = e.run(settle=False)
        fs = pool(e)["tiers"]["fs"]
        assert gate.submitted == 1 and gate.blocks == PROMPT_BLOCKS  # held: stuck
        assert gate.passed >= 1
        assert fs["timeouts"] == 1 and fs["promoted_hits"] == PROMPT_BLOCKS
        assert sum(r.loaded_pages for r in results) == PROMPT_BLOCKS == e.pages_checked
        assert quarantined(e) == PROMPT_BLOCKS

        gate.open()  # the stuck read lands in its own slots; reported, they are free
        e.settle()
        assert quarantined(e) == 0
        assert fs["breaker"] == "closed" == pool(e)["tiers"]["fs"]["breaker"]

        assert e.scheduler.reset_prefix_cache(reset_connector=True)
        e.settle()
        e.add("third", prompt + tokens(rng, 1), 2)
        assert sum(r.loaded_pages for r in drive(e)) == PROMPT_BLOCKS
        assert e.pages_checked == 2 * PROMPT_BLOCKS
        assert pool(e)["tiers"]["fs"]["promoted_hits"] == 2 * PROMPT_BLOCKS
    finally:
        e.close()
