"""`LatePromotions`, the bookkeeping behind level 1's deferred release (vLLM 0.34),
on a manual clock: what is late and when, which keys are answered as misses, and
when each event is set."""

from __future__ import annotations

from kvtiers_vllm.late_promotions import LatePromotions


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_promotion_is_late_only_past_its_deadline_and_released_when_reported() -> None:
    clock = Clock()
    late = LatePromotions(clock)
    late.track(1, 100.5, [b"a", b"b"])
    late.track(2, 101.0, [b"b", b"c"])
    assert late.expire() == [] and late.tracking
    clock.now = 100.5
    [(job, event)] = late.expire()
    assert job == 1 and not event.is_set() and late.releases_pending == 1
    assert late.is_late(b"a") and late.is_late(b"b") and not late.is_late(b"c")
    assert not late.finished(2)  # reported in time: a result like any other
    assert not late.tracking
    clock.now = 200.0
    assert late.expire() == []  # job 2 is no longer tracked
    assert late.finished(1)  # the late result: dropped, its event set now
    assert event.is_set() and late.late == 0 and not late.is_late(b"a")


def test_release_all_sets_every_event_and_keys_stay_late_until_reported() -> None:
    clock = Clock()
    late = LatePromotions(clock)
    late.track(1, 100.0, [b"a"])
    late.track(2, 100.0, [b"a"])
    events = dict(late.expire())
    late.release_all()  # the tier drained: no I/O is left
    assert all(e.is_set() for e in events.values()) and late.releases_pending == 0
    assert late.late == 2 and late.is_late(b"a")  # their results are still to come
    assert late.finished(1) and late.is_late(b"a")  # job 2 still counts
    assert late.finished(2) and not late.is_late(b"a") and late.late == 0
