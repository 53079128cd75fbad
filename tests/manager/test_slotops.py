"""The pool's per-block loops (`kvtiers.manager.slotops`): the optional C helper and
the Python loops give the same results, errors included, and a manager built on
either path (with the policies' C helper, `kvtiers.policies.slot_links`, on or off
alike) ends in the same state after the same calls."""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest
from kvtiers.manager import TieringOffloadingManager, slotops
from kvtiers.policies import slot_links
from kvtiers.policies.arc import ARCPolicy
from kvtiers.policies.lru import LRUPolicy
from kvtiers.policies.sieve import SievePolicy

native = pytest.mark.skipif(not slotops.NATIVE, reason="kvtiers.manager._slotops was not built")


def paths() -> list[tuple[Any, Any, Any]]:
    out = [(slotops.hold_py, slotops.release_py, slotops.fill_py)]
    if slotops.NATIVE:
        out.append((slotops._slotops.hold, slotops._slotops.release, slotops._slotops.fill))
    return out


@native
def test_native_and_python_loops_agree() -> None:
    rng = random.Random(11)
    (hold_a, release_a, fill_a), (hold_b, release_b, fill_b) = paths()
    n = 50
    ha, hb = array("i", bytes(4 * n)), array("i", bytes(4 * n))
    ba, bb = bytearray(n), bytearray(n)
    for _ in range(3000):
        slots = [rng.randrange(n) for _ in range(rng.randrange(8))]
        keys = [rng.randbytes(4) for _ in slots]
        if rng.random() < 0.5:
            assert hold_a(ha, keys, slots) == hold_b(hb, keys, slots)
        else:
            some: list[int | None] = [s if rng.random() < 0.8 else None for s in slots]
            ok = all(ha[s] >= some.count(s) for s in set(some) if s is not None)
            if ok:
                assert release_a(ha, keys, some) == release_b(hb, keys, some)
        value = rng.randrange(256)
        fill_a(ba, slots, value)
        fill_b(bb, slots, value)
        assert ha == hb and ba == bb


@pytest.mark.parametrize("impl", range(len(paths())), ids=["python", "native"][: len(paths())])
def test_errors(impl: int) -> None:
    hold, release, fill = paths()[impl]
    holds = array("i", [0, 1, 0])
    with pytest.raises(AssertionError, match="below zero"):
        release(holds, [b"a", b"b"], [1, 0])
    assert holds[1] == 0  # the one before the bad count was released
    with pytest.raises(ValueError, match="length"):
        hold(holds, [b"a"], [0, 1])
    with pytest.raises(IndexError):
        hold(holds, [b"a"], [3])
    with pytest.raises(IndexError):
        fill(bytearray(2), [2], 1)
    assert release(holds, [b"a", b"b"], [None, None]) == []


@native
@pytest.mark.parametrize("policy", [LRUPolicy, ARCPolicy, SievePolicy])
def test_manager_on_either_path_ends_the_same(
    policy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random engine protocol over a small pool, once per path: same answers,
    same stats, same slots."""

    def run(use_native: bool) -> tuple[list[Any], dict[str, Any], list[Any]]:
        monkeypatch.setattr(slotops, "USE_NATIVE", use_native)
        monkeypatch.setattr(slot_links, "USE_NATIVE", use_native and slot_links.NATIVE)
        rng = random.Random(5)
        mgr = TieringOffloadingManager(64, policy.for_slots(64))
        keys = [rng.randbytes(16) for _ in range(200)]
        answers: list[Any] = []
        inflight: list[tuple[list[bytes], list[bytes]]] = []
        for _ in range(600):
            start = rng.randrange(150)
            prompt = keys[start : start + rng.randrange(1, 24)]
            res = mgr.lookup_prefix(prompt)
            loads = prompt[: res.hits]
            mgr.prepare_load(loads)
            mgr.touch(loads)
            out = mgr.prepare_store(prompt[res.hits :])
            answers.append((res, out))
            inflight.append((loads, out.keys if out else []))
            if len(inflight) > 6 or rng.random() < 0.3:
                loads, stored = inflight.pop(rng.randrange(len(inflight)))
                mgr.complete_load(loads)
                mgr.complete_store(stored, success=rng.random() < 0.9)
            mgr.step()
        return answers, mgr.stats(), [mgr.slot_of(k) for k in keys]

    native_run = run(True)
    pool = native_run[1]["pool"]
    assert pool["evictions"] > 0 and pool["hits"] > 0 and pool["store_failures"] > 0
    assert native_run == run(False)
