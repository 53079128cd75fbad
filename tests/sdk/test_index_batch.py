"""`BoundedIndex`'s batch forms do what the per-key calls do: two indexes driven by
the same random operations, one through `Reservation.commit_many` (with `close` too)
and `pin`/`touch` of many keys at once, the other key by key (`commit` then `close`,
`pin([k])`, `touch([k])`),
end every step in the same state - entries, eviction order, pin counts, byte counts,
evictions, removals reported - and answer the same (verdicts, evicted entries,
commit results, errors)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.policies import ARCPolicy, LRUPolicy, SievePolicy
from kvtiers.sdk import BoundedIndex, Pins, Reservation, Verdict

POLICIES: dict[str, type[EvictionPolicy]] = {"lru": LRUPolicy, "sieve": SievePolicy,
                                              "arc": ARCPolicy}
KEYS = [bytes([i]) * 4 for i in range(24)]


class Side:
    """One index and what its caller holds: open reservations, pins."""

    def __init__(self, policy: str, capacity: int, queued: bool, batch: bool):
        self.removed: list[bytes] = []
        self.index: BoundedIndex[Any] = BoundedIndex(
            POLICIES[policy](capacity=8), capacity, on_removed=self.removed.extend,
            queued=queued)
        self.batch = batch
        self.rooms: list[Reservation[Any]] = []
        self.pins: list[list[Pins[Any]]] = []

    def state(self) -> tuple[Any, ...]:
        view = self.index.view()
        entries = {k: (e.location, e.size, e.pins) for k, e in view.entries.items()}
        return (entries, list(view.order), view.committed_bytes, view.reserved_bytes,
                view.evictable_bytes, view.evictions, list(self.removed))

    def reserve(self, items: list[tuple[bytes, int]]) -> tuple[Any, ...]:
        room = self.index.reserve(items)
        self.rooms.append(room)
        return list(room.verdicts), list(room.evicted)

    def commit(self, at: int, keys: list[bytes], locations: list[str],
               close: bool = False) -> tuple[Any, ...]:
        """A KeyError leaves the reservation open (with `close` too)."""
        room = self.rooms[at]
        if self.batch:
            try:
                done = room.commit_many(keys, locations, close=close)
            except KeyError as exc:
                return "KeyError", exc.args
        else:
            done = []
            for key, location in zip(keys, locations, strict=True):
                try:
                    done.append(room.commit(key, location))
                except KeyError as exc:
                    return "KeyError", exc.args
            if close:
                room.close()
        if close:
            self.rooms.pop(at)
        return "ok", done

    def close(self, at: int) -> None:
        self.rooms.pop(at).close()

    def pin(self, keys: list[bytes]) -> list[Any]:
        if self.batch:
            pins = [self.index.pin(keys)]
            locations = list(pins[0].locations)
        else:
            pins = [self.index.pin([k]) for k in keys]
            locations = [p.locations[0] for p in pins]
        self.pins.append(pins)
        return locations

    def unpin(self, at: int) -> None:
        for pins in self.pins.pop(at):
            pins.release()

    def touch(self, keys: list[bytes]) -> None:
        if self.batch:
            self.index.touch(keys)
        else:
            for key in keys:
                self.index.touch([key])

    def remove(self, key: bytes) -> Any:
        return self.index.remove(key)


def step(rnd: random.Random, sides: tuple[Side, Side]) -> None:
    a, b = sides
    op = rnd.randrange(7)
    if op == 0 or not a.rooms:
        items = [(k, rnd.choice((1, 2, 3))) for k in rnd.sample(KEYS, rnd.randint(1, 8))]
        assert a.reserve(items) == b.reserve(items)
    elif op == 1:
        at = rnd.randrange(len(a.rooms))
        room = a.rooms[at]
        reserved = [k for k, v in zip(room.keys, room.verdicts, strict=True)
                    if v is Verdict.RESERVED]
        keys = rnd.sample(reserved, rnd.randint(0, len(reserved)))
        if rnd.random() < 0.15:  # a key not reserved there (or committed already)
            keys.insert(rnd.randint(0, len(keys)), rnd.choice(KEYS))
        locations = [f"at-{rnd.randrange(4)}" for _ in keys]
        close = rnd.random() < 0.4  # a store's last commit
        assert a.commit(at, keys, locations, close) == b.commit(at, keys, locations, close)
    elif op == 2:
        at = rnd.randrange(len(a.rooms))
        a.close(at)
        b.close(at)
    elif op == 3:
        keys = [rnd.choice(KEYS) for _ in range(rnd.randint(0, 8))]  # repeats too
        assert a.pin(keys) == b.pin(keys)
    elif op == 4 and a.pins:
        at = rnd.randrange(len(a.pins))
        a.unpin(at)
        b.unpin(at)
    elif op == 5:
        keys = [rnd.choice(KEYS) for _ in range(rnd.randint(0, 8))]
        a.touch(keys)
        b.touch(keys)
    else:
        key = rnd.choice(KEYS)
        assert a.remove(key) == b.remove(key)


@pytest.mark.parametrize("queued", [False, True])
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("seed", range(12))
def test_batch_forms_match_per_key_calls(policy: str, queued: bool, seed: int) -> None:
    rnd = random.Random(seed)
    capacity = rnd.randint(4, 20)
    sides = (Side(policy, capacity, queued, batch=True),
             Side(policy, capacity, queued, batch=False))
    for _ in range(300):
        step(rnd, sides)
        assert sides[0].state() == sides[1].state()
    for side in sides:  # everything given back: nothing reserved, nothing pinned
        while side.rooms:
            side.close(0)
        while side.pins:
            side.unpin(0)
    assert sides[0].state() == sides[1].state()
    view = sides[0].index.view()
    assert view.reserved_bytes == 0
    assert all(e.pins == 0 for e in view.entries.values())
    assert view.evictable_bytes == view.committed_bytes


def test_commit_many_commits_the_keys_before_a_bad_one() -> None:
    index: BoundedIndex[str] = BoundedIndex(LRUPolicy(), 100)
    k1, k2, k3 = KEYS[:3]
    with index.reserve([(k1, 1), (k2, 1)]) as room:
        with pytest.raises(KeyError):
            room.commit_many([k1, k3, k2], ["a", "c", "b"])
        assert index.get(k1) == "a" and k2 not in index and k3 not in index
        assert room.commit_many([k2], ["b"]) == [True]
        with pytest.raises(KeyError):
            room.commit_many([k2], ["again"])  # committed already: not reserved now
        with pytest.raises(ValueError, match="locations"):
            room.commit_many([k1], [])
    assert index.view().entries[k2].pins == 0
    with pytest.raises(RuntimeError):
        room.commit_many([], [])


def test_commit_many_keeps_a_copy_committed_meanwhile() -> None:
    index: BoundedIndex[str] = BoundedIndex(LRUPolicy(), 100)
    k1, k2 = KEYS[:2]
    first, second = index.reserve([(k1, 5), (k2, 5)]), index.reserve([(k1, 5)])
    assert second.verdicts == [Verdict.RESERVED]
    assert first.commit_many([k1, k2], ["first", "first"]) == [True, True]
    assert second.commit_many([k1], ["second"]) == [False]
    assert index.get(k1) == "first"
    assert index.reserved_bytes == 0 and index.committed_bytes == 10
    first.close()
    second.close()
    assert index.view().evictable_bytes == 10
