"""vLLM PR #46216's stress-run config, verbatim, on the installed vLLM (the suite runs
on every supported minor): kvtiers reads it as `kvtiers validate` does (vLLM runs that
stack with its own code), and it runs through vLLM's real scheduler and connector on
CPU with only what this machine needs changed (the harness's CPU worker, a pool and a
root that fit here), a prompt coming back from its fs tier byte for byte. Its two
kvtiers forms (the same document with kvtiers' spec, or with kvtiers' tier under
vLLM's) run in tests/vllm/test_spec.py and here."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtiers.config import load_config
from kvtiers_vllm.plugin import TIER_TYPE, register
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from tests.vllm import harness as h
from tests.vllm.test_spec import CHUNK, drive, loaded, tokens

TIERING = "Pr46216TieringSpec"
h.cpu_worker_spec(TieringOffloadingSpec, TIERING)
register()  # what vLLM's plugin loader does in each of its processes
BLOCKS = 8

# vLLM PR #46216's stress run, exactly as its author passed it to `vllm serve`.
PR46216: dict[str, Any] = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 429496729600,
        "eviction_policy": "lru",
        "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/nvme_storage"}],
    },
}


def test_kvtiers_reads_it_verbatim_as_vllms_own_stack() -> None:
    cfg = load_config(copy.deepcopy(PR46216), check_machine=False)
    [tier] = cfg.secondary_tiers
    assert tier.type == "fs" and tier.options["root_dir"] == "/mnt/nvme_storage"
    assert cfg.cpu_bytes_to_use == 400 << 30 and cfg.eviction_policy == "lru"
    assert cfg.vllm_runs == (0,) and cfg.vllm_spec == "TieringOffloadingSpec"
    assert cfg.warnings == ()


def here(root: Path, *, kvtiers_tier: bool) -> dict[str, Any]:
    """The config's extra section with what this machine needs: the harness's
    subclass of the spec (its CPU worker), a 16-block pool, a root under the test's
    directory. `kvtiers_tier`: its fs entry, as it is, as kvtiers' tier under vLLM's
    spec."""
    extra: dict[str, Any] = copy.deepcopy(PR46216["kv_connector_extra_config"])
    extra.update(spec_name=TIERING, spec_module_path=h.SPEC_MODULE, cpu_bytes_to_use=16 * CHUNK)
    entry = extra["secondary_tiers"][0]
    root.mkdir()  # as /mnt/nvme_storage is there before the engine starts
    entry["root_dir"] = str(root)
    if kvtiers_tier:  # the entry as it is: its capacity derived from the free space
        extra["secondary_tiers"] = [{"type": TIER_TYPE, "tier": entry}]
    return extra


@pytest.mark.parametrize("kvtiers_tier", [False, True], ids=["vllm-fs", "kvtiers-fs"])
def test_it_runs_through_vllms_scheduler_and_blocks_come_back_from_fs(
    model_dir: Path, tmp_path: Path, kvtiers_tier: bool
) -> None:
    e = h.Engine(model_dir, here(tmp_path / "fs", kvtiers_tier=kvtiers_tier))
    try:
        rng = random.Random(46216)
        prompt = tokens(rng, BLOCKS)
        e.add("first", prompt, 2)
        drive(e)
        # Only fs keeps it: the GPU's cache and the CPU pool are emptied.
        assert e.scheduler.reset_prefix_cache(reset_connector=True)
        e.settle()
        e.add("again", prompt + tokens(rng, 1), 2)
        assert loaded(drive(e)) == BLOCKS == e.pages_checked
    finally:
        e.close()
