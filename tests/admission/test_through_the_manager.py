"""Admission through the manager and the config: with `second_touch` a block
reaches the tier only when stored a second time; `all` keeps today's behaviour;
the bytes promoted are the bytes stored."""

from __future__ import annotations

import os

import pytest
from kvtiers.config import load_config
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.keys import make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.errors import ConfigError
from kvtiers.manager.build import build_manager

NS = Namespace("test/model", (BlockGeometry(2, 2, 64, "float16", 16),))
BLOCK = NS.groups[0].block_bytes
SLOTS = 8


def _config(admission: object = None, write_policy: str = "write_through") -> dict:
    tier: dict = {"type": "memory", "capacity_bytes": 256 * BLOCK}
    if admission is not None:
        tier["admission"] = admission
    return {"cpu_bytes_to_use": SLOTS * BLOCK, "write_policy": write_policy,
            "cascade_queue_blocks": 64, "secondary_tiers": [tier]}


class Engine:
    """Stores random bytes into the slots it gets, checks the bytes it loads."""

    def __init__(self, doc: dict):
        self.pool = PoolView.anonymous(SLOTS, BLOCK)
        self.mgr = build_manager(load_config(doc), self.pool, NS, clock=ManualClock())
        self.content: dict[bytes, bytes] = {}

    def store(self, keys: list[bytes]) -> None:
        out = self.mgr.prepare_store(keys)
        for _ in range(5):  # write_back: dirty victims are copied down before they go
            if out is not None:
                break
            self.settle()
            out = self.mgr.prepare_store(keys)
        assert out is not None
        for k, slot in zip(out.keys, out.slots, strict=True):
            data = os.urandom(BLOCK)
            self.pool.block(slot)[:] = data
            self.content[k] = data
        self.mgr.complete_store(out.keys)
        self.settle()

    def settle(self) -> None:
        for _ in range(20):
            self.mgr.step()
            self.mgr.drain(10)
            self.mgr.step()

    def tier(self) -> dict:
        stats: dict = self.mgr.stats()["tiers"]["memory"]
        return stats

    def serve(self, k: bytes) -> bool:
        """Look `k` up as an engine does; on a hit load it and check its bytes."""
        answer = self.mgr.lookup(k)
        while answer in (LookupResult.HIT_PENDING, LookupResult.RETRY):
            self.settle()
            answer = self.mgr.lookup(k)
        if answer is not LookupResult.HIT:
            return False
        slots = self.mgr.prepare_load([k])
        try:
            assert bytes(self.pool.block(slots[0])) == self.content[k]
        finally:
            self.mgr.complete_load([k])
        return True


@pytest.fixture
def engines():
    made: list[Engine] = []

    def make(doc: dict) -> Engine:
        made.append(Engine(doc))
        return made[-1]

    yield make
    for e in made:
        e.mgr.close()


def keys(n: int) -> list[bytes]:
    return [make_key(os.urandom(32)) for _ in range(n)]


def test_second_touch_writes_a_block_only_on_its_second_store(engines) -> None:
    e = engines(_config("second_touch"))
    first = keys(SLOTS)
    e.store(first)
    assert e.tier()["cascaded_blocks"] == 0 and e.tier()["cascades_not_admitted"] == SLOTS
    assert e.tier()["bytes_written"] == 0
    e.store(keys(SLOTS))  # evicts `first` from the pool: nowhere else to find them
    e.mgr.reset()
    assert not any(e.serve(k) for k in first)  # not admitted: misses, recomputed
    e.store(first)  # the second store: proven reuse, copied down now
    assert e.tier()["cascaded_blocks"] == SLOTS
    e.mgr.reset()
    assert all(e.serve(k) for k in first)  # served from the tier, bytes checked
    assert e.tier()["promoted_hits"] == SLOTS


def test_all_is_the_default_and_writes_every_block(engines) -> None:
    for doc in (_config(), _config("all")):
        e = engines(doc)
        first = keys(SLOTS)
        e.store(first)
        assert e.tier()["cascaded_blocks"] == SLOTS
        assert e.tier()["cascades_not_admitted"] == 0
        e.mgr.reset()
        assert all(e.serve(k) for k in first)


def test_second_touch_under_write_back_drops_first_victims(engines) -> None:
    e = engines(_config({"policy": "second_touch", "window_blocks": 1000},
                        write_policy="write_back"))
    first = keys(SLOTS)
    e.store(first)
    e.store(keys(SLOTS))  # evicts `first`, dirty: offered once, refused, gone
    assert e.tier()["cascaded_blocks"] == 0 and e.tier()["cascades_not_admitted"] == SLOTS
    assert not any(e.serve(k) for k in first)
    e.store(first)  # recomputed; the next eviction is their second offer
    e.store(keys(SLOTS))
    e.settle()
    assert e.tier()["cascaded_blocks"] == SLOTS
    e.mgr.reset()
    assert all(e.serve(k) for k in first)


def test_a_workload_of_one_hit_wonders_writes_far_less(engines) -> None:
    # Half the blocks come back once after leaving the pool; half never do.
    reused, once = keys(64), keys(64)
    results = {}
    for admission in ("all", "second_touch"):
        e = engines(_config(admission))
        for i in range(0, 64, SLOTS):
            e.store(reused[i:i + SLOTS])
            e.store(once[i:i + SLOTS])
        for i in range(0, 64, SLOTS):  # the reused ones come back: recomputed if missed
            batch = reused[i:i + SLOTS]
            missed = [k for k in batch if not e.serve(k)]
            e.mgr.reset()
            if missed:
                e.store(missed)
        for k in reused:  # and once more
            e.mgr.reset()
            e.serve(k)
        stats = e.tier()
        results[admission] = (stats["bytes_written"], stats["promoted_hits"])
    (all_bytes, all_hits), (st_bytes, st_hits) = results["all"], results["second_touch"]
    assert all_bytes == 128 * BLOCK and st_bytes == 64 * BLOCK  # the one-hit blocks: never
    assert all_hits == 128 and st_hits == 64  # each reused block: served once, not twice


def test_config_errors_name_the_path(engines) -> None:
    bad = [
        ("second_tuch", "$.secondary_tiers[0].admission", "did you mean 'second_touch'"),
        (7, "$.secondary_tiers[0].admission", "admission policy"),
        ({"policy": "second_touch", "windw_blocks": 3}, "$.secondary_tiers[0].admission",
         "window_blocks"),
        ({"policy": "second_touch", "window_blocks": 0},
         "$.secondary_tiers[0].admission.window_blocks", ">= 1"),
    ]
    for admission, path, text in bad:
        with pytest.raises(ConfigError) as err:
            load_config(_config(admission))
        problems = err.value.problems
        assert any(p.path.startswith(path) and text in p.message for p in problems), problems
    nested = {"cpu_bytes_to_use": SLOTS * BLOCK, "secondary_tiers": [{
        "type": "faulty", "admission": "second_touch",
        "inner": {"type": "memory", "capacity_bytes": BLOCK * 8, "admission": "all"}}]}
    with pytest.raises(ConfigError) as err:
        load_config(nested)
    assert [p.path for p in err.value.problems] == ["$.secondary_tiers[0].inner.admission"]


def test_the_resolved_config_round_trips() -> None:
    config = load_config(_config("second_touch"))
    section = config.secondary_tiers[0]
    assert section.admission == "second_touch"
    assert dict(section.admission_options) == {"window_blocks": None, "bits_per_key": 10}
    assert "admission" not in section.options  # the tier never sees it
    again = load_config(config.to_dict())
    assert again.secondary_tiers[0] == section
    assert "admission" not in load_config(_config()).secondary_tiers[0].to_dict()


def test_a_pool_hit_is_a_touch_under_write_through(engines) -> None:
    e = engines(_config("second_touch"))
    first, other = keys(SLOTS // 2), keys(SLOTS // 2)
    e.store(first + other)
    assert e.tier()["cascaded_blocks"] == 0
    assert all(e.serve(k) for k in first)  # reused while resident: offered again
    e.settle()
    assert e.tier()["cascaded_blocks"] == len(first)
    written = e.tier()["bytes_written"]
    assert written >= len(first) * BLOCK
    assert all(e.serve(k) for k in first)  # a further hit: no second copy
    e.settle()
    assert (e.tier()["cascaded_blocks"], e.tier()["bytes_written"]) == (len(first), written)
    e.mgr.reset()
    assert all(e.serve(k) for k in first)  # from the tier, bytes checked
    assert e.tier()["promoted_hits"] == len(first)
    assert not any(e.serve(k) for k in other)  # never reused: never written


def test_a_pool_hit_is_a_touch_under_write_back(engines) -> None:
    e = engines(_config({"policy": "second_touch", "window_blocks": 1000},
                        write_policy="write_back"))
    first, other = keys(SLOTS // 2), keys(SLOTS // 2)
    e.store(first + other)
    assert all(e.serve(k) for k in first)  # used once in the pool
    e.store(keys(SLOTS))  # evicts all eight, dirty: the used ones are admitted
    e.settle()
    assert e.tier()["cascaded_blocks"] == len(first)
    assert e.tier()["cascades_not_admitted"] >= len(other)
    e.mgr.reset()
    assert all(e.serve(k) for k in first)
    assert not any(e.serve(k) for k in other)


def test_the_refused_memory_is_bounded_by_the_pool(engines) -> None:
    e = engines(_config({"policy": "second_touch", "window_blocks": 100000}))
    for _ in range(6):
        e.store(keys(SLOTS))
    rt = e.mgr._traffic.tiers[0]
    assert len(rt.refused) == SLOTS  # only the resident ones can still be hit
