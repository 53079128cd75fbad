"""Metrics recorded by the instrumented manager and tiers, exported through
prometheus_client and parsed back with its text parser: a real pool, a real memory
tier, random bytes checked after every promotion."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from kvtiers.config import load_config
from kvtiers.contract.keys import make_key
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.metrics import LabelledSink
from kvtiers.contract.namespace import BlockGeometry, Namespace
from kvtiers.contract.pool_view import PoolView
from kvtiers.manager.build import build_manager
from kvtiers.manager.metered_tier import MeteredTier
from kvtiers.metrics.defs import ALL_METRICS, JOB_BUCKETS
from kvtiers.metrics.instrument import MeteredManager
from kvtiers.metrics.recorder import MetricsRecorder

prometheus_client = pytest.importorskip("prometheus_client")
from kvtiers.metrics.prometheus import MetricsExporter  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

BLOCK = 8192
SLOTS = 16
NS = Namespace("test/metrics", (BlockGeometry(2, 2, 64, "float16", 16),))


def key(i: int) -> bytes:
    return make_key(i.to_bytes(32, "big"), 0)


def scrape(exporter: MetricsExporter) -> dict[str, Any]:
    """name -> {labels tuple: value} for every sample, after a round trip through
    the text format."""
    text = prometheus_client.generate_latest(exporter.registry()).decode()
    out: dict[str, Any] = {"_families": {}}
    for fam in text_string_to_metric_families(text):
        out["_families"][fam.name] = fam.type
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_a_promotion_shows_in_flight_then_landed_with_its_job_latency() -> None:
    pool = PoolView.anonymous(SLOTS, BLOCK)
    config = load_config({"cpu_bytes_to_use": pool.nbytes, "secondary_tiers": [
        {"type": "memory", "capacity_bytes": 64 * BLOCK}]})
    recorder = MetricsRecorder()
    mgr = MeteredManager(build_manager(config, pool, NS, metrics=recorder), recorder,
                         publish_interval_s=0.0)
    exporter = MetricsExporter(recorder)
    try:
        keys = [key(i) for i in range(6)]
        content = {k: os.urandom(BLOCK) for k in keys}
        out = mgr.prepare_store(keys)
        assert out is not None
        for k, slot in zip(keys, out.slots, strict=True):
            pool.block(slot)[:] = content[k]
        mgr.complete_store(keys)
        assert mgr.drain(10)
        mgr.reset()  # the pool forgets them; the memory tier has them
        assert [mgr.lookup(k) for k in keys] == [LookupResult.HIT_PENDING] * 6
        mgr.step()  # submits the promotion job; not collected yet
        m = scrape(exporter)
        assert m["kvtiers_tier_promotions_in_flight"][(("tier", "memory"),)] == 6
        assert m["kvtiers_manager_promotions_in_flight"][()] == 6
        assert m["kvtiers_tier_lookups_total"][(("result", "hit"), ("tier", "memory"))] == 6
        assert mgr.drain(10)
        assert [mgr.lookup(k) for k in keys] == [LookupResult.HIT] * 6
        slots = mgr.prepare_load(keys)
        for k, slot in zip(keys, slots, strict=True):
            assert bytes(pool.block(slot)) == content[k]
        mgr.complete_load(keys)
        mgr.step()
        m = scrape(exporter)
        t = (("tier", "memory"),)
        assert m["kvtiers_tier_promotions_in_flight"][t] == 0
        assert m["kvtiers_tier_promoted_blocks_total"][t] == 6
        assert m["kvtiers_tier_written_bytes_total"][t] == 6 * BLOCK
        assert m["kvtiers_tier_read_bytes_total"][t] == 6 * BLOCK
        assert m["kvtiers_tier_usage_bytes"][t] == 6 * BLOCK
        assert m["kvtiers_tier_capacity_bytes"][t] == 64 * BLOCK
        assert m["kvtiers_tier_breaker_state"][(("state", "closed"), *t)] == 1
        assert m["kvtiers_tier_breaker_state"][(("state", "open"), *t)] == 0
        load = (("kind", "load"), *t)
        assert m["kvtiers_tier_job_seconds_count"][load] == 1
        inf = (("kind", "load"), ("le", "+Inf"), *t)
        assert m["kvtiers_tier_job_seconds_bucket"][inf] == 1
        assert m["kvtiers_pool_lookups_total"][(("result", "hit"),)] == 6
        assert m["kvtiers_pool_slots"][()] == SLOTS
        assert m["kvtiers_pool_stored_blocks_total"][()] == 6
        assert m["kvtiers_manager_call_seconds_count"][(("call", "lookup"),)] == 12
        assert m["kvtiers_manager_call_seconds_count"][(("call", "prepare_load"),)] == 1
        for d in ALL_METRICS:  # every defined family is exported, with its type
            assert m["_families"][d.name.removesuffix("_total")] == d.kind, d.name
    finally:
        mgr.close()


def test_recording_from_many_threads_loses_nothing() -> None:
    recorder = MetricsRecorder()
    sink = LabelledSink(recorder, tier="t")
    n, threads = 1000 * len(JOB_BUCKETS), 4

    def work(i: int) -> None:
        for j in range(n):
            sink.count("tier_lookup", result="hit")
            sink.observe("tier_job_seconds", JOB_BUCKETS[j % len(JOB_BUCKETS)], kind=str(i))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert dict(recorder.counters("tier_lookup")) == {
        (("result", "hit"), ("tier", "t")): float(n * threads)}
    metric = next(d for d in ALL_METRICS if d.event == "tier_job_seconds")
    hists = dict(recorder.histograms(metric))
    assert len(hists) == threads
    for h in hists.values():
        assert h.count == n and h.buckets[-1] == (float("inf"), n)
        # value == bucket bound lands in that bucket (le): bucket i holds n/len each
        per = n // len(JOB_BUCKETS)
        assert [c for _, c in h.buckets[:-1]] == [per * (i + 1) for i in
                                                   range(len(JOB_BUCKETS))]


def test_unknown_and_misused_names_are_dropped_and_counted() -> None:
    recorder = MetricsRecorder()
    recorder.count("no_such_event")
    recorder.count("tier_job_seconds")  # a histogram counted
    recorder.observe("tier_lookup", 1.0)  # a counter observed
    assert dict(recorder.counters("-")) == {
        (("event", "no_such_event"),): 1.0, (("event", "tier_job_seconds"),): 1.0,
        (("event", "tier_lookup"),): 1.0}
    assert list(recorder.counters("tier_lookup")) == []


def test_the_metered_tier_keeps_the_inner_tiers_flags_and_extras() -> None:
    pool = PoolView.anonymous(SLOTS, BLOCK)
    config = load_config({"cpu_bytes_to_use": pool.nbytes, "secondary_tiers": [
        {"type": "memory", "capacity_bytes": 64 * BLOCK}]})
    mgr = build_manager(config, pool, NS, metrics=MetricsRecorder())
    try:
        tier = mgr.stats()  # noqa: F841 - stats work through the wrapper
        (rt,) = mgr._traffic.tiers
        assert isinstance(rt.tier, MeteredTier)
        assert rt.tier.verifies == rt.tier.inner.verifies
        assert rt.tier.damage is not None  # the memory tier's own extra, through it
    finally:
        mgr.close()


def test_recording_never_waits_for_a_scrape_in_progress() -> None:
    """A scrape stopped half-way through its collect (in the middle of reading the
    shards) does not hold up recording: the scheduler's and the tier threads' calls
    share no lock with it."""
    recorder = MetricsRecorder()
    recorder.count("tier_lookup", tier="t", result="hit")
    exporter = MetricsExporter(recorder)
    registry = exporter.registry()
    inside, release = threading.Event(), threading.Event()
    real = recorder.counters

    def paused(name: str) -> Any:
        inside.set()
        assert release.wait(60)
        return real(name)

    recorder.counters = paused  # type: ignore[method-assign]
    scrape = threading.Thread(target=prometheus_client.generate_latest, args=(registry,))
    scrape.start()
    try:
        assert inside.wait(60)
        for _ in range(1000):  # would hang here if recording waited for the scrape
            recorder.count("tier_lookup", tier="t", result="hit")
            recorder.observe("manager_call_seconds", 1e-5, call="lookup")
    finally:
        release.set()
        scrape.join(60)
    recorder.counters = real  # type: ignore[method-assign]
    assert dict(recorder.counters("tier_lookup")) == {
        (("result", "hit"), ("tier", "t")): 1001.0}


def test_bound_recorders_feed_the_same_series() -> None:
    recorder = MetricsRecorder()
    add = recorder.counter("tier_lookup", result="hit", tier="t")
    seen = recorder.observer("tier_job_seconds", kind="load", tier="t")
    add(2.0)
    recorder.count("tier_lookup", tier="t", result="hit")
    seen(0.003)
    recorder.observe("tier_job_seconds", 100.0, tier="t", kind="load")
    recorder.counter("no_such_event")(1.0)
    assert dict(recorder.counters("tier_lookup")) == {(("result", "hit"), ("tier", "t")): 3.0}
    metric = next(d for d in ALL_METRICS if d.event == "tier_job_seconds")
    ((labels, h),) = recorder.histograms(metric)
    assert labels == (("kind", "load"), ("tier", "t")) and h.count == 2
    assert h.sum == pytest.approx(100.003)
    assert dict(h.buckets)[0.005] == 1 and dict(h.buckets)[60.0] == 1
    assert dict(recorder.counters("-")) == {(("event", "no_such_event"),): 1.0}


def test_with_call_timing_off_the_call_histograms_stay_empty_and_counters_count() -> None:
    """`metrics.scheduler_call_timing: false`: the engine's calls are the manager's
    own methods (nothing between), `kvtiers_manager_call_seconds` has no series,
    and the tiers' and the pool's counters and the job histograms still count; a
    promotion's bytes arrive intact."""
    pool = PoolView.anonymous(SLOTS, BLOCK)
    config = load_config({"cpu_bytes_to_use": pool.nbytes,
                          "metrics": {"scheduler_call_timing": False},
                          "secondary_tiers": [{"type": "memory", "capacity_bytes": 64 * BLOCK}]})
    assert config.metrics.scheduler_call_timing is False
    assert load_config(config.to_dict()).metrics == config.metrics
    recorder = MetricsRecorder()
    inner = build_manager(config, pool, NS, metrics=recorder)
    mgr = MeteredManager(inner, recorder, publish_interval_s=0.0,
                         call_timing=config.metrics.scheduler_call_timing)
    exporter = MetricsExporter(recorder)
    try:
        assert mgr.lookup == inner.lookup and mgr.prepare_store == inner.prepare_store
        keys = [key(100 + i) for i in range(5)]
        content = {k: os.urandom(BLOCK) for k in keys}
        out = mgr.prepare_store(keys)
        assert out is not None
        for k, slot in zip(keys, out.slots, strict=True):
            pool.block(slot)[:] = content[k]
        mgr.complete_store(keys)
        assert mgr.drain(10)
        mgr.reset()
        assert [mgr.lookup(k) for k in keys] == [LookupResult.HIT_PENDING] * 5
        mgr.step()
        assert mgr.drain(10)
        assert mgr.lookup_prefix(keys).hits == 5
        slots = mgr.prepare_load(keys)
        for k, slot in zip(keys, slots, strict=True):
            assert bytes(pool.block(slot)) == content[k]
        mgr.complete_load(keys)
        mgr.step()
        m = scrape(exporter)
        assert m["_families"]["kvtiers_manager_call_seconds"] == "histogram"
        assert not any(name.startswith("kvtiers_manager_call_seconds") for name in m)
        assert dict(recorder.counters("manager_call_seconds")) == {}
        t = (("tier", "memory"),)
        assert m["kvtiers_tier_lookups_total"][(("result", "hit"), *t)] == 5
        assert m["kvtiers_tier_promoted_blocks_total"][t] == 5
        assert m["kvtiers_tier_job_seconds_count"][(("kind", "load"), *t)] == 1
        assert m["kvtiers_pool_lookups_total"][(("result", "pending"),)] == 5
        assert m["kvtiers_pool_stored_blocks_total"][()] == 5
        assert m["kvtiers_pool_loaded_blocks_total"][()] == 5
    finally:
        mgr.close()
    # the default times every call: the same calls fill the histogram
    recorder = MetricsRecorder()
    timed = MeteredManager(build_manager(load_config({"cpu_bytes_to_use": pool.nbytes}), pool,
                                         NS, metrics=recorder), recorder)
    try:
        assert timed.lookup(key(1)) is LookupResult.MISS
        m = scrape(MetricsExporter(recorder))
        assert m["kvtiers_manager_call_seconds_count"][(("call", "lookup"),)] == 1
    finally:
        timed.close()
