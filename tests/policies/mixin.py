"""The contract every eviction policy keeps (see `kvtiers.contract.eviction`), as one test
class: a policy's test module subclasses `PolicyContract`, sets `policy_cls`, and adds
tests of its own ordering."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Hashable
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from kvtiers.contract.eviction import EvictionPolicy

KEYS = [f"k{i}" for i in range(12)]


class PolicyMachine(RuleBasedStateMachine):
    """Drives a policy and a reference model (a set of keys, a set of pinned keys)
    side by side; the policy may choose any victims, but only unpinned members."""

    policy_cls: type[EvictionPolicy]

    def __init__(self) -> None:
        super().__init__()
        self.policy: Any = self.policy_cls()
        self.members: dict[str, int | None] = {}  # key -> the value it was inserted with
        self.pinned: set[str] = set()
        self.evicted = 0
        self.uses = 0  # calls that may mark an entry as used (touch, insert of a member)

    @initialize(capacity=st.sampled_from([None, 4, 8]))
    def set_capacity(self, capacity: int | None) -> None:
        self.policy = self.policy_cls(capacity=capacity)

    @rule(key=st.sampled_from(KEYS), value=st.integers(0, 99))
    def insert(self, key: str, value: int) -> None:
        self.uses += key in self.members
        self.policy.insert(key, value)
        self.members.setdefault(key, value)  # a present key keeps its value

    @rule(key=st.sampled_from(KEYS))
    def touch(self, key: str) -> None:
        self.uses += 1
        self.policy.touch(key)

    @rule(key=st.sampled_from(KEYS))
    def pin(self, key: str) -> None:
        self.policy.pin(key)
        if key in self.members:
            self.pinned.add(key)

    @rule(key=st.sampled_from(KEYS))
    def unpin(self, key: str) -> None:
        self.policy.unpin(key)
        self.pinned.discard(key)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: str) -> None:
        self.policy.remove(key)
        self.members.pop(key, None)
        self.pinned.discard(key)

    @rule(n=st.integers(0, 6), with_values=st.booleans())
    def evict(self, n: int, with_values: bool) -> None:
        if with_values:
            items = self.policy.evict_items(n)
            victims = [key for key, _ in items]
            assert all(self.members.get(key) == value for key, value in items)
        else:
            victims = self.policy.evict(n)
        candidates = self.members.keys() - self.pinned
        assert len(victims) == min(n, len(candidates))
        assert len(set(victims)) == len(victims)
        assert set(victims) <= candidates
        for key in victims:
            del self.members[key]
        self.evicted += len(victims)

    @precondition(lambda self: not self.pinned)
    @rule()
    def export_restore(self) -> None:
        state = self.policy.export()
        json.dumps(state)
        assert sorted(state) == sorted(self.members)
        # The original, left alone, evicts in export order; so does a restored copy.
        assert copy.deepcopy(self.policy).evict(len(state)) == state
        probe = self.policy_cls(capacity=self.policy.capacity)
        probe.restore(state)
        assert probe.evict(len(state)) == state
        # Carry on from a restored policy, as a persistent tier does after a restart
        # (values are not exported: restored entries hold None).
        self.policy = self.policy_cls(capacity=self.policy.capacity)
        self.policy.restore(state)
        self.members = dict.fromkeys(self.members, None)
        self.evicted = self.uses = 0

    @invariant()
    def matches_model(self) -> None:
        policy = self.policy
        assert len(policy) == len(self.members)
        for key in KEYS:
            assert (key in policy) == (key in self.members)
            assert policy.is_pinned(key) == (key in self.pinned)
            assert policy.get(key, "absent") == self.members.get(key, "absent")

    @invariant()
    def examined_is_amortised_constant(self) -> None:
        # Each look either picks a victim or passes over an entry that a use marked.
        assert self.policy.examined <= self.evicted + self.uses


class PolicyContract:
    policy_cls: ClassVar[type[EvictionPolicy]]

    def make(self, capacity: int | None = None) -> EvictionPolicy:
        return self.policy_cls(capacity=capacity)

    def filled(self, keys: list[Hashable], capacity: int | None = None) -> EvictionPolicy:
        policy = self.make(capacity)
        for key in keys:
            policy.insert(key)
        return policy

    # --- membership --------------------------------------------------------------

    def test_empty(self) -> None:
        policy = self.make()
        assert len(policy) == 0
        assert "a" not in policy
        assert policy.evict(3) == []
        assert policy.export() == []

    def test_insert_contains_len(self) -> None:
        policy = self.filled(["a", "b", "c"])
        assert len(policy) == 3
        assert "b" in policy and "z" not in policy
        policy.insert("b")  # already present: only a use
        assert len(policy) == 3

    def test_name_is_registered_name(self) -> None:
        assert isinstance(self.policy_cls.name, str) and self.policy_cls.name

    # --- eviction ----------------------------------------------------------------

    def test_evict_at_most_n(self) -> None:
        policy = self.filled(list(range(10)))
        assert len(policy.evict(3)) == 3
        assert len(policy) == 7
        assert policy.evict(0) == []
        assert policy.evict(-1) == []
        assert len(policy.evict(100)) == 7
        assert len(policy) == 0

    def test_evicted_keys_are_gone_and_distinct(self) -> None:
        policy = self.filled(list(range(20)))
        victims = policy.evict(20)
        assert len(victims) == 20 and set(victims) == set(range(20))
        assert not any(key in policy for key in range(20))

    def test_pinned_never_evicted(self) -> None:
        policy = self.filled(list(range(10)))
        for key in (0, 4, 9):
            policy.pin(key)
        victims = policy.evict(100)
        assert len(victims) == 7 and set(victims) == {1, 2, 3, 5, 6, 7, 8}
        assert len(policy) == 3
        assert all(policy.is_pinned(key) for key in (0, 4, 9))
        assert policy.evict(5) == []
        policy.unpin(4)
        assert policy.evict(5) == [4]

    def test_evict_returns_fewer_when_pinned(self) -> None:
        policy = self.filled(["a", "b", "c"])
        policy.pin("a")
        policy.pin("c")
        assert policy.evict(3) == ["b"]

    def test_pin_is_boolean_not_counted(self) -> None:
        policy = self.filled(["a"])
        policy.pin("a")
        policy.pin("a")
        assert policy.is_pinned("a")
        policy.unpin("a")
        assert not policy.is_pinned("a")
        policy.unpin("a")
        assert policy.evict(1) == ["a"]

    def test_insert_and_touch_of_pinned_keep_it_pinned(self) -> None:
        policy = self.filled(["a", "b"])
        policy.pin("a")
        policy.insert("a")
        policy.touch("a")
        assert policy.is_pinned("a") and len(policy) == 2
        assert policy.evict(2) == ["b"]

    # --- values: the pool keeps each block's slot in its policy entry ----------------

    def test_values_follow_their_keys(self) -> None:
        policy: Any = self.make(capacity=8)
        for i in range(8):
            policy.insert(f"k{i}", i)
        policy.touch("k1")
        policy.pin("k2")
        policy.touch("k2")
        assert [policy.get(f"k{i}") for i in range(8)] == list(range(8))
        assert policy.get("zz") is None and policy.get("zz", -1) == -1
        policy.insert("k3", 99)  # present: a use, the value is kept
        assert policy.get("k3") == 3
        policy.unpin("k2")
        items = policy.evict_items(8)
        assert sorted(items) == [(f"k{i}", i) for i in range(8)]
        assert policy.get("k0") is None

    def test_evict_and_evict_items_agree(self) -> None:
        a: Any = self.make(capacity=10)
        b: Any = self.make(capacity=10)
        for i in range(10):
            a.insert(i, -i)
            b.insert(i, -i)
            if i % 3 == 0:
                a.touch(i // 2)
                b.touch(i // 2)
        items = a.evict_items(4)
        assert [key for key, _ in items] == b.evict(4)
        assert all(value == -key for key, value in items)
        assert a.examined == b.examined

    def test_insert_without_value_holds_none(self) -> None:
        policy: Any = self.filled(["a"])
        assert "a" in policy and policy.get("a", "absent") is None
        assert policy.evict_items(1) == [("a", None)]

    # --- removal and unknown keys --------------------------------------------------

    def test_remove(self) -> None:
        policy = self.filled(["a", "b", "c"])
        policy.pin("b")
        policy.remove("b")
        policy.remove("c")
        assert "b" not in policy and "c" not in policy
        assert not policy.is_pinned("b")
        assert len(policy) == 1
        policy.insert("b")  # comes back unpinned
        assert not policy.is_pinned("b")
        assert set(policy.evict(5)) == {"a", "b"}

    def test_unknown_keys_are_ignored(self) -> None:
        policy = self.filled(["a"])
        for op in (policy.touch, policy.pin, policy.unpin, policy.remove):
            op("zz")
        assert "zz" not in policy
        assert not policy.is_pinned("zz")
        assert len(policy) == 1

    def test_evicted_key_can_come_back(self) -> None:
        policy = self.filled(["a", "b"])
        victim = policy.evict(1)[0]
        policy.insert(victim)
        assert victim in policy and len(policy) == 2

    # --- export / restore ---------------------------------------------------------

    def _busy(self, seed: int = 7) -> EvictionPolicy:
        rng = random.Random(seed)
        policy = self.make(capacity=60)
        for _ in range(2000):
            key = f"k{rng.randrange(100)}"
            op = rng.random()
            if op < 0.4:
                policy.insert(key)
            elif op < 0.7:
                policy.touch(key)
            elif op < 0.8:
                policy.pin(key)
            elif op < 0.9:
                policy.unpin(key)
            if len(policy) > 60:
                policy.evict(len(policy) - 60)
        return policy

    def test_export_is_json_ready_and_complete(self) -> None:
        policy = self._busy()
        state = policy.export()
        assert json.loads(json.dumps(state)) == state
        assert len(state) == len(set(state)) == len(policy)
        assert all(key in policy for key in state)

    def test_restore_reproduces_eviction_order(self) -> None:
        policy = self._busy()
        pinned = [key for key in policy.export() if policy.is_pinned(key)]
        assert pinned, "the workload should leave some entries pinned"
        state = policy.export()
        fresh = self.make(capacity=60)
        fresh.restore(state)
        assert len(fresh) == len(policy)
        assert not any(fresh.is_pinned(key) for key in state)
        # The restored policy evicts in export order, and that is the order the
        # original would have followed with no further use; pinned entries last.
        unpinned = len(policy) - len(pinned)
        assert fresh.evict(len(state)) == state
        assert policy.evict(len(state)) == state[:unpinned]
        assert state[unpinned:] == pinned

    # --- cost: pinned entries are never walked ------------------------------------

    def test_pinned_entries_are_never_examined(self) -> None:
        n, k = 20_000, 50
        policy = self.filled(list(range(n)), capacity=n)
        # Pin the oldest 90%: exactly what a walking implementation would trip over.
        for key in range(n * 9 // 10):
            policy.pin(key)
            policy.touch(key)  # uses of pinned entries must not cost eviction either
        before = policy.examined
        victims = policy.evict(k)
        assert len(victims) == k
        assert policy.examined - before <= 2 * k
        rest = policy.evict(n)
        assert len(rest) == n // 10 - k
        assert policy.examined - before <= 2 * (n // 10)

    def test_eviction_cost_does_not_grow_with_pinned_share(self) -> None:
        def cost(pinned_share: float) -> float:
            rng = random.Random(3)
            n = 20_000
            policy = self.filled(list(range(n)), capacity=n)
            for key in rng.sample(range(n), int(n * pinned_share)):
                policy.pin(key)
            unpinned = [key for key in range(n) if not policy.is_pinned(key)]
            for key in rng.sample(unpinned, len(unpinned) // 4):
                policy.touch(key)  # marks for SIEVE, promotions for ARC
            before, evicted = policy.examined, 0
            for _ in range(10):
                evicted += len(policy.evict(100))
            assert evicted == 1000
            return (policy.examined - before) / evicted

        # Passing over used entries is paid by the uses; never by the pinned ones.
        assert cost(0.9) <= 2.0
        assert cost(0.0) <= 2.0

    # --- the model ----------------------------------------------------------------

    def test_batch_calls_match_single_calls(self) -> None:
        """`pin_many`, `unpin_many`, `touch_many` and `insert_pinned` leave a policy as
        the loops over single calls do (the defaults are those loops; an override
        must keep them)."""
        rng = random.Random(7)
        for _ in range(60):
            batch, single = self.make(), self.make()
            members: set[str] = set()
            for _ in range(40):
                op = rng.choice(["insert", "pin", "unpin", "touch", "insert_pinned", "evict"])
                keys = rng.sample(KEYS, rng.randint(0, 5))
                if op == "insert":
                    for key in keys:
                        batch.insert(key, len(key))
                        single.insert(key, len(key))
                    members.update(keys)
                elif op == "insert_pinned":
                    new = [k for k in keys if k not in members]
                    batch.insert_pinned(new, [len(k) for k in new])
                    for key in new:
                        single.insert(key, len(key))
                        single.pin(key)
                    members.update(new)
                elif op == "evict":
                    victims = batch.evict(2)
                    assert single.evict(2) == victims
                    members.difference_update(victims)
                else:
                    getattr(batch, f"{op}_many")(keys)
                    for key in keys:
                        getattr(single, op)(key)
                assert batch.export() == single.export()
                assert all(batch.is_pinned(k) == single.is_pinned(k) for k in KEYS)
            assert batch.evict(len(KEYS)) == single.evict(len(KEYS))

    def test_state_machine(self) -> None:
        machine: Any = type(
            f"{self.policy_cls.__name__}Machine", (PolicyMachine,), {"policy_cls": self.policy_cls}
        )
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=150,
                stateful_step_count=40,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
