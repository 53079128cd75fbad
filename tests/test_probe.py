"""`AsyncProbe`: RETRY until a batch answers, one batch per burst of checks, TTLs on
the injectable clock, first-hand verdicts, failures as misses, a prompt close and a
bounded cache. Batches wait at a gate the test opens, so nothing depends on timing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from kvtiers.contract.clock import ManualClock
from kvtiers.contract.keys import make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.sdk.probe import AsyncProbe

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY

MakeProbe = Callable[..., AsyncProbe]  # make_probe(backend, **AsyncProbe options)


def k(i: int) -> bytes:
    return make_key(i.to_bytes(8, "big"))


class Backend:
    """The storage a probe looks into. Each batch is recorded, waits at `gate`
    (open unless `gated`), and answers from `exists` (or raises when `fail`)."""

    def __init__(self, gated: bool = False):
        self.exists: set[bytes] = set()
        self.batches: list[list[bytes]] = []
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)  # released once per batch started
        self.fail = False
        if not gated:
            self.gate.set()

    def __call__(self, keys: Sequence[bytes]) -> Iterator[bytes]:
        self.batches.append(list(keys))
        self.entered.release()
        assert self.gate.wait(30), "gate never opened"
        if self.fail:
            raise OSError("storage unreachable")
        return (key for key in keys if key in self.exists)  # any iterable will do

    def wait_entered(self) -> None:
        assert self.entered.acquire(timeout=10), "no batch started"

    def probed(self, key: bytes) -> int:
        return sum(batch.count(key) for batch in self.batches)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_probe(clock: ManualClock) -> Iterator[MakeProbe]:
    made: list[tuple[AsyncProbe, Any]] = []

    def make(backend: Any, **kwargs: Any) -> AsyncProbe:
        kwargs.setdefault("clock", clock)
        probe = AsyncProbe(backend, **kwargs)
        made.append((probe, backend))
        return probe

    yield make
    for probe, backend in made:
        if isinstance(backend, Backend):
            backend.gate.set()
        probe.close()


def test_retry_then_hit_or_miss(make_probe: MakeProbe) -> None:
    backend = Backend()
    backend.exists.add(k(1))
    probe = make_probe(backend)
    assert probe.check(k(1)) is RETRY
    assert probe.check(k(2)) is RETRY
    assert probe.wait_idle(10)
    assert probe.check(k(1)) is HIT
    assert probe.check(k(2)) is MISS
    assert probe.probed == 2 and probe.batches == len(backend.batches)
    assert probe.idle()


def test_one_batch_per_burst_of_checks(make_probe: MakeProbe) -> None:
    backend = Backend(gated=True)
    probe = make_probe(backend)
    assert probe.check(k(0)) is RETRY
    backend.wait_entered()  # the thread took [k0] and waits at the gate
    burst = [k(i) for i in range(1, 10)]
    for key in burst + burst:  # a step's checks, each key asked twice
        assert probe.check(key) is RETRY
    assert not probe.idle()
    assert not probe.wait_idle(0.05)  # still gated
    backend.gate.set()
    assert probe.wait_idle(10)
    # The burst went out as one batch, each key once.
    assert backend.batches == [[k(0)], burst]
    assert probe.batches == 2 and probe.probed == 10
    assert all(probe.check(key) is MISS for key in burst)
    assert probe.batches == 2  # answered from the cache


def test_a_key_asked_again_while_its_probe_runs_is_not_probed_twice(make_probe: MakeProbe) -> None:
    """bug: check() re-queues a key whose probe is in flight (the batch was taken
    off the queue, its verdict not stored yet), so a slow backend probes every key
    at least twice when the engine asks again each step."""
    backend = Backend(gated=True)
    probe = make_probe(backend)
    assert probe.check(k(1)) is RETRY
    backend.wait_entered()
    assert probe.check(k(1)) is RETRY  # next scheduler step, probe still running
    backend.gate.set()
    assert probe.wait_idle(10)
    assert probe.check(k(1)) is MISS
    assert backend.probed(k(1)) == 1, f"probed in batches {backend.batches}"


def test_verdicts_expire_after_their_ttl(make_probe: MakeProbe, clock: ManualClock) -> None:
    backend = Backend()
    backend.exists.add(k(1))
    probe = make_probe(backend, hit_ttl_s=60, miss_ttl_s=1)
    probe.check(k(1))
    probe.check(k(2))
    assert probe.wait_idle(10)
    clock.advance(0.5)
    assert (probe.check(k(1)), probe.check(k(2))) == (HIT, MISS)
    n = len(backend.batches)
    clock.advance(0.5)  # the miss verdict is exactly 1 s old: expired
    backend.exists.add(k(2))  # written by another process meanwhile
    assert probe.check(k(2)) is RETRY
    assert probe.check(k(1)) is HIT
    assert probe.wait_idle(10)
    assert len(backend.batches) == n + 1
    assert probe.check(k(2)) is HIT  # found on the next probe
    clock.advance(59)  # k1's hit verdict is now 60 s old
    assert probe.check(k(1)) is RETRY
    backend.exists.discard(k(1))  # deleted by another process
    assert probe.wait_idle(10)
    assert probe.check(k(1)) is MISS


def test_record_and_forget(make_probe: MakeProbe, clock: ManualClock) -> None:
    backend = Backend(gated=True)
    probe = make_probe(backend, hit_ttl_s=10, miss_ttl_s=2)
    probe.record(k(1), True)  # the tier just wrote it
    probe.record(k(2), False)  # the tier just deleted it
    assert (probe.check(k(1)), probe.check(k(2))) == (HIT, MISS)
    assert backend.batches == []  # first-hand verdicts need no probe
    probe.record(k(1), False)  # a newer first-hand verdict wins
    assert probe.check(k(1)) is MISS
    clock.advance(2)  # the miss TTL applies to recorded misses too
    assert probe.check(k(2)) is RETRY
    probe.record(k(3), True)
    probe.forget(k(3))
    probe.forget(k(99))  # unknown: nothing happens
    assert probe.check(k(3)) is RETRY  # forgotten: ask the storage again
    backend.gate.set()
    assert probe.wait_idle(10)
    assert probe.check(k(3)) is MISS


def test_a_failing_probe_answers_misses_and_is_logged(
    make_probe: MakeProbe, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = Backend()
    backend.exists.add(k(1))
    backend.fail = True
    probe = make_probe(backend, miss_ttl_s=1)
    with caplog.at_level(logging.ERROR, logger="kvtiers.probe"):
        assert probe.check(k(1)) is RETRY
        assert probe.check(k(2)) is RETRY
        assert probe.wait_idle(10)
    assert probe.check(k(1)) is MISS and probe.check(k(2)) is MISS
    assert "failed; treating them as misses" in caplog.text
    assert any(r.exc_info for r in caplog.records)  # with the traceback
    # The thread survived: once the storage is back and the miss expired, it answers.
    backend.fail = False
    clock.advance(1)
    assert probe.check(k(1)) is RETRY
    assert probe.wait_idle(10)
    assert probe.check(k(1)) is HIT


def test_extra_keys_from_the_probe_function_are_ignored(make_probe: MakeProbe) -> None:
    probe = make_probe(lambda keys: [*keys, k(50)])  # claims a key nobody asked about
    assert probe.check(k(1)) is RETRY
    assert probe.wait_idle(10)
    assert probe.check(k(1)) is HIT
    assert probe.check(k(50)) is RETRY  # not cached from a batch it was not in


def test_close_when_idle_is_prompt_and_later_checks_miss(make_probe: MakeProbe) -> None:
    backend = Backend()
    probe = make_probe(backend)
    start = time.monotonic()
    probe.close()
    assert time.monotonic() - start < 1
    assert not probe._thread.is_alive()
    assert probe.check(k(1)) is MISS  # never RETRY: nobody would ever answer
    assert probe.idle() and backend.batches == []
    probe.close()  # idempotent


def test_close_is_prompt_while_a_probe_hangs(make_probe: MakeProbe) -> None:
    """bug: close() joins the probe thread without a timeout; a probe stuck on the
    network (a hung HEAD request) makes the tier's close, and the engine's
    shutdown, hang with it. The thread is a daemon: close need not wait for it."""
    backend = Backend(gated=True)
    probe = make_probe(backend)
    probe.check(k(1))
    backend.wait_entered()
    closer = threading.Thread(target=probe.close, daemon=True)
    closer.start()
    closer.join(2)
    hung = closer.is_alive()
    backend.gate.set()  # let the probe end either way
    closer.join(10)
    assert not hung, "AsyncProbe.close() waited for a hung probe"
    assert probe.check(k(2)) is MISS


def test_after_close_even_cached_verdicts_are_misses(make_probe: MakeProbe) -> None:
    """bug (small): check() after close() still answers HIT from the cache; a
    closed tier then looks like it has blocks it can no longer load."""
    probe = make_probe(Backend())
    probe.record(k(1), True)
    probe.close()
    assert probe.check(k(1)) is MISS


def test_the_verdict_cache_is_bounded(make_probe: MakeProbe) -> None:
    backend = Backend()
    probe = make_probe(backend, max_cached=3)
    for i in range(5):
        probe.record(k(i), True)
    assert len(probe._verdicts) == 3
    assert [probe.check(k(i)) for i in (2, 3, 4)] == [HIT, HIT, HIT]
    assert probe.check(k(0)) is RETRY  # the oldest were dropped
    assert probe.wait_idle(10)
    for i in range(10, 20):
        probe.check(k(i))
    assert probe.wait_idle(10)
    assert len(probe._verdicts) == 3  # verdicts from batches are bounded too
    probe.record(k(19), False)  # refreshing a cached key drops nothing
    assert len(probe._verdicts) == 3 and probe.check(k(19)) is MISS
