"""A tier that answers per request (`SecondaryTier.lookup_in_request`, as p2p does
for a request's `remote_prefiller`) is asked with the id of the request whose
blocks vLLM's real scheduler looks up, at both levels: kvtiers' manager under
`KvtiersOffloadingSpec` (level 2) and a kvtiers tier under vLLM's tiering spec
(level 1). The core's memory tier, its `lookup_in_request` recorded; every page
a load writes is checked by the harness."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.tiers.memory import MemoryTier

from tests.vllm import harness as h
from tests.vllm.test_spec import drive, extra, loaded, tokens
from tests.vllm.test_spec_options import BLOCKS, level1, pushed_to_fs

MEMORY = {"type": "memory", "capacity_bytes": 1 << 20}
PARAMS = {"remote_prefiller": {"remote_host": "10.0.0.1", "remote_port": 5555}}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return h.write_tiny_llama(tmp_path_factory.mktemp("model"))


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Give the memory tier a `lookup_in_request` (and record its request hooks):
    what it was asked, by request id."""
    seen: dict[str, Any] = {"lookups": [], "started": {}}

    def lookup_in_request(self: MemoryTier, key: BlockKey, request_id: str) -> LookupResult:
        answer = self.lookup(key)
        seen["lookups"].append((request_id, answer))
        return answer

    real_start = MemoryTier.on_request_start

    def on_request_start(self: MemoryTier, request_id: str, params: Any = None) -> None:
        seen["started"][request_id] = params
        real_start(self, request_id, params)

    monkeypatch.setattr(MemoryTier, "lookup_in_request", lookup_in_request, raising=False)
    monkeypatch.setattr(MemoryTier, "on_request_start", on_request_start)
    yield seen


def config(level: int, tmp_path: Path) -> dict[str, Any]:
    if level == 2:
        return extra(16, secondary_tiers=[MEMORY])
    cfg = level1(tmp_path / "unused", 16)
    cfg["secondary_tiers"][0]["tier"] = MEMORY
    return cfg


@pytest.mark.parametrize("level", [1, 2])
def test_the_scheduler_asks_the_tier_with_the_requests_id(
    model: Path, tmp_path: Path, asked: dict[str, Any], level: int
) -> None:
    e = h.Engine(model, config(level, tmp_path))
    try:
        rng = random.Random(41)
        (prompt,) = pushed_to_fs(e, rng, 1)  # stored, cascaded, then out of the pool
        first = len(asked["lookups"])
        assert first and all(rid != "b" for rid, _ in asked["lookups"])
        e.add("b", prompt + tokens(rng, 1), 2, kv_transfer_params=PARAMS)
        assert loaded(drive(e)) == BLOCKS  # from the memory tier, pages checked
        mine = asked["lookups"][first:]
        assert mine and {rid for rid, _ in mine} == {"b"}
        assert (("b", LookupResult.HIT)) in mine
        assert asked["started"]["b"] == PARAMS
    finally:
        e.close()
