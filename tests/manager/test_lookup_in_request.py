"""`SecondaryTier.lookup_in_request`: the manager asks a tier that overrides it with
the id of the request looking up (and only then), plain `lookup` everywhere else;
the wrappers (`faulty`, the metrics' `MeteredTier`) forward it. Real memory tiers,
random bytes, every promoted block checked."""

from __future__ import annotations

from typing import Any

from kvtiers.contract.keys import BlockKey
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.tier import SecondaryTier, TierContext
from kvtiers.manager.metered_tier import MeteredTier
from kvtiers.metrics.recorder import MetricsRecorder
from kvtiers.tiers.faulty import FaultyTier
from kvtiers.tiers.memory import MemoryTier

from tests.manager.conftest import key, memory_tier

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING
OPTIONS = memory_tier(16)["options"]


class PerRequest(MemoryTier):
    """A memory tier whose blocks only the requests in `allowed` see."""

    def __init__(self, ctx: TierContext, config: Any):
        super().__init__(ctx, config)
        self.allowed: set[str] = set()
        self.asked: list[tuple[BlockKey, str]] = []
        self.plain: list[BlockKey] = []

    def lookup(self, key: BlockKey) -> LookupResult:
        self.plain.append(key)
        return super().lookup(key)

    def lookup_in_request(self, key: BlockKey, request_id: str) -> LookupResult:
        self.asked.append((key, request_id))
        if request_id not in self.allowed:
            return LookupResult.MISS
        return super().lookup(key)


class Plain(MemoryTier):
    """A memory tier that does not override `lookup_in_request` (records lookups)."""

    def __init__(self, ctx: TierContext, config: Any):
        super().__init__(ctx, config)
        self.plain: list[BlockKey] = []

    def lookup(self, key: BlockKey) -> LookupResult:
        self.plain.append(key)
        return super().lookup(key)


def _spec(cls: type[SecondaryTier], name: str, wrap: Any = None) -> dict[str, Any]:
    def factory(ctx: TierContext) -> SecondaryTier:
        tier = cls(ctx, OPTIONS)
        return tier if wrap is None else wrap(tier)
    return {"type": "memory", "name": name, "factory": factory}


def test_only_a_tier_that_overrides_it_is_asked_with_the_request(harness: Any) -> None:
    h = harness(4, tiers=[_spec(Plain, "plain"), _spec(PerRequest, "mine")])
    plain, mine = h.tiers
    assert not plain.answers_in_request() and mine.answers_in_request()
    assert h.mgr.request_lookups
    data = h.seed(mine, key(1))
    # The plain tier gets `lookup`, the overriding one the request's id.
    assert h.mgr.lookup(key(1), request_id="r-other") is MISS
    assert plain.plain == [key(1)] and mine.asked == [(key(1), "r-other")] and not mine.plain
    mine.allowed.add("r-mine")
    assert h.mgr.lookup(key(1), request_id="r-mine") is PENDING
    assert mine.asked[-1] == (key(1), "r-mine")
    h.settle()
    assert h.mgr.lookup(key(1)) is HIT
    h.load_and_check([key(1)])
    assert h.content[key(1)] == data


def test_no_request_means_plain_lookup_for_every_tier(harness: Any) -> None:
    h = harness(4, tiers=[_spec(PerRequest, "mine")])
    (mine,) = h.tiers
    h.seed(mine, key(2))
    assert h.mgr.lookup(key(2)) is PENDING  # no request: the tier's own lookup, a hit
    assert mine.plain == [key(2)] and not mine.asked
    h.settle()
    h.load_and_check([key(2)])


def test_lookup_prefix_passes_the_request_on(harness: Any) -> None:
    h = harness(8, tiers=[_spec(PerRequest, "mine")])
    (mine,) = h.tiers
    keys = [key(i) for i in range(10, 14)]
    for k in keys:
        h.seed(mine, k)
    assert h.mgr.lookup_prefix(keys, request_id="nobody").hits == 0
    assert mine.asked == [(keys[0], "nobody")]  # the scan stops at its first miss
    mine.allowed.add("r")
    first = h.mgr.lookup_prefix(keys, request_id="r")
    assert first.hits == 0 and first.retry  # all four promotions started
    assert [rid for _, rid in mine.asked[1:]] == ["r"] * 4
    h.settle()
    assert h.mgr.lookup_prefix(keys, request_id="r").hits == 4
    h.load_and_check(keys)


def test_a_stack_without_such_tiers_reports_none(harness: Any) -> None:
    h = harness(4, tiers=[_spec(Plain, "plain")])
    assert not h.mgr.request_lookups
    h.seed(h.tiers[0], key(3))
    assert h.mgr.lookup(key(3), request_id="r") is PENDING  # plain lookup, id unused
    assert h.tiers[0].plain == [key(3)]


def test_the_faulty_wrapper_forwards_the_request(harness: Any) -> None:
    wrap = FaultyTier.wrap
    h = harness(4, tiers=[_spec(PerRequest, "faulty-mine", wrap), _spec(Plain, "faulty", wrap)])
    mine_w, plain_w = h.tiers
    assert mine_w.answers_in_request() and not plain_w.answers_in_request()
    mine = mine_w.inner
    mine.allowed.add("r")
    h.seed(mine, key(4))
    assert h.mgr.lookup(key(4), request_id="r") is PENDING
    assert mine.asked == [(key(4), "r")] and plain_w.inner.plain == []  # a hit: not asked
    h.settle()
    h.load_and_check([key(4)])
    assert h.mgr.lookup(key(5), request_id="x") is MISS
    assert mine.asked[-1] == (key(5), "x") and plain_w.inner.plain == [key(5)]


def test_the_miss_draws_of_faulty_are_the_same_with_or_without_a_request(harness: Any) -> None:
    """A wrapper injecting misses does so on either path, from the same stream."""
    specs = []
    for name in ("a", "b"):
        def wrap(t: SecondaryTier) -> FaultyTier:
            return FaultyTier.wrap(t, miss_rate=0.5, seed=3)
        specs.append(_spec(PerRequest, name, wrap))
    h = harness(64, tiers=specs[:1])
    g = harness(64, tiers=specs[1:])
    (a,), (b,) = h.tiers, g.tiers
    a.inner.allowed.add("r")
    keys = [key(i) for i in range(100, 140)]
    for k in keys:
        h.seed(a, k)
        g.seed(b, k)
    with_request = [h.mgr.lookup(k, request_id="r") for k in keys]
    without = [g.mgr.lookup(k) for k in keys]
    assert with_request == without and MISS in without and PENDING in without
    assert a.faults["miss"] == b.faults["miss"] > 0


def test_the_metered_wrapper_forwards_the_request_and_counts_it(harness: Any) -> None:
    sink = MetricsRecorder()

    def wrap(t: SecondaryTier) -> MeteredTier:
        return MeteredTier(t, t.ctx.name, sink)

    h = harness(4, tiers=[_spec(PerRequest, "mine", wrap), _spec(Plain, "plain", wrap)])
    mine_w, plain_w = h.tiers
    assert mine_w.answers_in_request() and not plain_w.answers_in_request()
    mine_w.inner.allowed.add("r")
    h.seed(mine_w.inner, key(6))
    assert h.mgr.lookup(key(6), request_id="r") is PENDING
    assert mine_w.inner.asked == [(key(6), "r")]
    h.settle()
    h.load_and_check([key(6)])
    assert h.mgr.lookup(key(7), request_id="r") is MISS
    assert plain_w.inner.plain == [key(7)]
    counted = {(dict(labels)["tier"], dict(labels)["result"]): value
               for labels, value in sink.counters("tier_lookup")}
    assert counted[("mine", "hit")] == 1 and counted[("mine", "miss")] == 1
    assert counted[("plain", "miss")] == 1
