"""Failures cost misses, never wrong bytes and never an exception in SGLang's
threads: SGLang's own failure injector around the backend, a damaged page, a tier
that hangs (held past its deadline by the `faulty` tier) and one that is stuck (its
I/O still running after the deadline)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from kvtiers_sglang.keys import block_keys
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageFailureInjector

from .harness import extra_config, fs_tier, make_backend, page_keys


def test_sglang_failure_injector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang wraps the backend in its injector (failures on half the calls): every
    answer has SGLang's shape, and a page reported loaded holds what was stored."""
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.5")
    backend, pool = make_backend(extra_config([fs_tier(tmp_path / "fs")]))
    assert isinstance(backend, HiCacheStorageFailureInjector)
    gen = torch.Generator().manual_seed(11)
    stored: dict[str, bytes] = {}
    outcomes = set()
    for _ in range(12):
        pool.fill_random(gen)
        keys = page_keys(gen, 4)
        done = backend.batch_set_v1(keys, pool.indices([0, 1, 2, 3]))
        assert isinstance(done, list) and len(done) == 4
        for p, (key, ok) in enumerate(zip(keys, done, strict=True)):
            if ok:
                stored[key] = pool.page_bytes(p)
        names = list(stored)[-4:]
        if not names:
            continue
        found = backend.batch_exists(names)
        assert isinstance(found, int) and 0 <= found <= len(names)
        got = backend.batch_get_v1(names, pool.indices([8, 9, 10, 11][: len(names)]))
        assert isinstance(got, list) and len(got) == len(names)
        for p, (name, ok) in enumerate(zip(names, got, strict=True)):
            outcomes.add(ok)
            if ok:
                assert pool.page_bytes(8 + p) == stored[name]
    assert outcomes == {True, False}
    backend.close()


def test_a_damaged_page_is_a_miss(tmp_path: Path) -> None:
    """One byte flipped in the V half of one page on disk: that page is a miss (its
    other half loads), every other page loads its stored bytes."""
    gen = torch.Generator().manual_seed(12)
    backend, pool = make_backend(extra_config([fs_tier(tmp_path / "fs")]))
    pool.fill_random(gen)
    keys = page_keys(gen, 4)
    assert backend.batch_set_v1(keys, pool.indices([0, 1, 2, 3])) == [True] * 4
    stored = [pool.page_bytes(p) for p in range(4)]
    _, v_half = block_keys(keys[2], 2)
    (path,) = tmp_path.glob(f"fs/*/blocks/*/{v_half.hex()}.kvb")
    data = bytearray(path.read_bytes())
    data[4096 + 77] ^= 0x5A
    path.write_bytes(bytes(data))
    pool.fill_random(gen)
    assert backend.batch_get_v1(keys, pool.indices([5, 6, 7, 8])) == [True, True, False, True]
    assert [pool.page_bytes(p) for p in (5, 6, 8)] == [stored[0], stored[1], stored[3]]
    assert backend.kvtiers_stats()["bridge"]["failed_by_reason"] == {"corrupt": 1}
    backend.close()


def test_a_hanging_tier_costs_misses_at_its_deadline(tmp_path: Path) -> None:
    """Every load hangs (the `faulty` tier holds it past its deadline): SGLang's call
    returns misses once job_timeout_s has passed, counted as timeouts; stores and
    lookups go on."""
    tier = {"type": "faulty", "inner": fs_tier(tmp_path / "fs"), "hang_rate": 1.0,
            "ops": ["load"]}
    extra = extra_config([tier], job_timeout_s=0.2, breaker={"failures": 100, "cooldown_s": 1})
    backend, pool = make_backend(extra)
    gen = torch.Generator().manual_seed(13)
    pool.fill_random(gen)
    keys = page_keys(gen, 3)
    assert backend.batch_set_v1(keys, pool.indices([0, 1, 2])) == [True] * 3
    assert backend.batch_exists(keys) == 3
    before = [pool.page_bytes(p) for p in (4, 5, 6)]
    assert backend.batch_get_v1(keys, pool.indices([4, 5, 6])) == [False] * 3
    assert [pool.page_bytes(p) for p in (4, 5, 6)] == before  # nothing written
    assert backend.kvtiers_stats()["bridge"]["failed_by_reason"] == {"timeout": 6}
    backend.close()


class Gate:
    """Holds a tier's loads until `open()`; each then runs without a deadline, as a
    read already under way at its deadline would."""

    def __init__(self, tier: Any) -> None:
        self.opened = threading.Event()
        self.threads: list[threading.Thread] = []
        submit = tier.submit_load

        def held(job: Any) -> None:
            def run() -> None:
                self.opened.wait()
                submit(type(job)(job.job_id, job.keys, job.slots, None))

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            self.threads.append(thread)

        tier.submit_load = held

    def open(self) -> None:
        """Let the held loads go; returns once each was submitted to the tier."""
        self.opened.set()
        for thread in self.threads:
            thread.join()


def test_a_stuck_tier_is_abandoned_then_skipped(tmp_path: Path) -> None:
    """A tier whose loads do not end: SGLang's call returns misses a grace period
    after the deadline, the job stays abandoned (counted) until the tier reports
    it, and the breaker then skips the tier (misses at once); once the tier
    answers again the stack takes its late report."""
    extra = extra_config([fs_tier(tmp_path / "fs")], job_timeout_s=0.1,
                         breaker={"failures": 1, "cooldown_s": 3600})
    backend, pool = make_backend(extra)
    gen = torch.Generator().manual_seed(14)
    pool.fill_random(gen)
    keys = page_keys(gen, 2)
    assert backend.batch_set_v1(keys, pool.indices([0, 1])) == [True, True]
    stack = backend.stack
    assert stack is not None
    gate = Gate(stack.tier("fs"))
    assert backend.batch_get_v1(keys, pool.indices([4, 5])) == [False, False]
    bridge = backend.kvtiers_stats()["bridge"]
    assert bridge["abandoned_jobs"] == 1 and bridge["abandoned_pending"] == 1
    assert stack.breaker_open() == ["fs"]
    assert backend.batch_exists(keys) == 0  # skipped: a miss, no wait
    gate.open()
    stack.tier("fs").drain(5)
    backend.close()
    assert backend.kvtiers_stats()["bridge"]["abandoned_pending"] == 0
