"""Level 2's answer to a promotion still "writing" past its deadline, on every
supported vLLM: kvtiers' manager (`KvtiersOffloadingSpec`) times the promotion out
at `job_timeout_s`, the request recomputes, and the promotion's pool slots stay
quarantined (neither free nor resident: nothing else is put there) until the tier
reports the job; then they are free again. vLLM's deferred release (0.34, level 1)
is not needed here: the pool is kvtiers'. Through vLLM's real scheduler on CPU."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from tests.vllm import harness as h
from tests.vllm.gated_tier import Gate
from tests.vllm.test_spec import PROMPT_BLOCKS, drive, extra, pool, tokens


def quarantined(e: h.Engine) -> int:
    stats = pool(e)["pool"]
    return int(stats["num_slots"] - stats["free"] - stats["resident"])


def test_a_late_promotion_quarantines_its_slots_until_the_tier_reports(
    model_dir: Path, tmp_path: Path
) -> None:
    e = h.Engine(model_dir, extra(16, tmp_path / "fs", job_timeout_s=0.05))
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

        e.add("again", prompt + tokens(rng, 1), 2)
        results = e.run(settle=False)  # finishes: the promotion timed out, recomputed
        # Every promotion timed out (the manager may promote what is left of the
        # prompt again once the first timed out, into other slots), and each one's
        # slots are held: nothing else is put where a late read may still land.
        assert sum(r.loaded_pages for r in results) == 0 and gate.submitted >= 1
        assert pool(e)["tiers"]["fs"]["timeouts"] == gate.submitted
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
