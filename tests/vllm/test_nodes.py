"""Secondary tiers on an engine whose workers span nodes are refused by
`KvtiersOffloadingSpec` (the tiers would store other nodes' parts of vLLM's CPU rows
as the engine core's node sees them), as vLLM 0.34's tiering spec refuses them for
level 1. vLLM's group functions are replaced here by a fake grid of workers: a real
multi-node engine is not something a test can start on one machine."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtiers_vllm import nodes
from vllm.distributed import parallel_state

from tests.vllm import harness as h
from tests.vllm.test_spec import extra


def fake_grid(monkeypatch: pytest.MonkeyPatch, **groups: list[bool]) -> list[str]:
    """TP, PP and PCP groups whose workers are on the source's node or not
    (`tp=[True, False]`: two workers, the second on another node); a group not
    given has one worker. Returns the groups `in_the_same_node_as` was asked about."""
    asked: list[str] = []
    for name in ("tp", "pp", "pcp"):
        places = groups.get(name, [True])
        group = SimpleNamespace(world_size=len(places), cpu_group=name)
        monkeypatch.setattr(parallel_state, f"get_{name}_group", lambda g=group: g)

    def in_the_same_node_as(cpu_group: str, source_rank: int = 0) -> list[bool]:
        assert source_rank == 0
        asked.append(cpu_group)
        return groups[cpu_group]

    monkeypatch.setattr(parallel_state, "in_the_same_node_as", in_the_same_node_as)
    return asked


def test_one_node(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = fake_grid(monkeypatch, tp=[True, True], pp=[True, True])
    assert not nodes.workers_span_nodes()
    assert asked == ["tp", "pp"]  # every group of several workers, a collective each


def test_a_group_across_nodes_spans_and_every_group_is_still_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = fake_grid(monkeypatch, tp=[True, False], pcp=[True, True])
    assert nodes.workers_span_nodes()
    assert asked == ["tp", "pcp"]  # pcp too: each worker joins every collective


def test_the_spec_refuses_secondary_tiers_across_nodes(
    monkeypatch: pytest.MonkeyPatch, model_dir: Path, tmp_path: Path
) -> None:
    engine = h.Engine(model_dir, extra(16, tmp_path / "fs"))
    try:
        spec: Any = engine.worker_spec
        parallel = dataclasses.replace(spec.config.parallel, world_size=2, tp_size=2)
        monkeypatch.setattr(spec, "config", dataclasses.replace(spec.config, parallel=parallel))
        fake_grid(monkeypatch, tp=[True, False])
        with pytest.raises(NotImplementedError, match="workers span several nodes"):
            spec.create_worker(None)
    finally:
        engine.close()
