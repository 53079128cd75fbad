"""`EventLog` on its own."""

from __future__ import annotations

from kvtiers.contract.events import TierEvents
from kvtiers.manager.event_log import EventLog

from tests.manager.conftest import key


def test_off_it_keeps_nothing_and_leaves_the_tiers_reporters_off():
    log, reporter = EventLog(), TierEvents()
    log.watch("fs", reporter)
    log.stored([key(1)])
    log.removed([key(1)], "fs")
    reporter.removed([key(2)])
    log.collect()
    assert not log.enabled and not reporter.enabled
    assert log.pending() == [] and log.take() == []


def test_on_it_keeps_events_in_order_until_taken():
    log, reporter = EventLog(), TierEvents()
    log.watch("fs#2", reporter)
    log.enable()
    assert reporter.enabled
    log.stored([key(1)])
    log.stored([])  # nothing to say: no event
    log.stored([key(2)], source="fs#2")
    reporter.removed([key(3), key(4)])
    log.collect()
    log.removed([key(1)])
    got = [(e.kind, e.tier, e.source, e.keys) for e in log.take()]
    assert got == [
        ("stored", "cpu", None, [key(1)]),
        ("stored", "cpu", "fs#2", [key(2)]),
        ("removed", "fs#2", None, [key(3), key(4)]),
        ("removed", "cpu", None, [key(1)]),
    ]
    assert log.take() == []


def test_a_reporter_shared_by_a_wrapper_and_its_inner_tier_is_watched_once():
    log, reporter, other = EventLog(enabled=True), TierEvents(), TierEvents()
    log.watch("faulty", reporter)
    log.watch("faulty.inner", reporter)
    log.watch("fs", other)  # watched after enable(): turned on at once
    assert other.enabled
    reporter.removed([key(1)])
    log.collect()
    assert [(e.tier, e.keys) for e in log.take()] == [("faulty", [key(1)])]
