"""ARC: the shared contract, promotion to T2, adaptation of p, bounded ghosts."""

from __future__ import annotations

from collections.abc import Hashable

from kvtiers.policies.arc import ARCPolicy

from .mixin import PolicyContract


class TestARC(PolicyContract):
    policy_cls = ARCPolicy

    def make(self, capacity: int | None = None) -> ARCPolicy:
        return ARCPolicy(capacity)

    def filled(self, keys: list[Hashable], capacity: int | None = None) -> ARCPolicy:
        policy = self.make(capacity)
        for key in keys:
            policy.insert(key)
        return policy

    def test_entries_used_again_outlive_one_time_entries(self) -> None:
        policy = self.filled(["a", "b", "c", "d"], capacity=4)
        policy.touch("a")  # promoted to T2
        policy.touch("b")
        assert policy.evict(2) == ["c", "d"]  # p = 0: T1 goes first, oldest first
        assert policy.evict(2) == ["a", "b"]

    def test_one_time_scan_does_not_flush_frequent_entries(self) -> None:
        capacity = 100
        policy = self.make(capacity)
        hot = [f"hot{i}" for i in range(50)]
        for key in hot:
            policy.insert(key)
            policy.touch(key)
        for i in range(5_000):
            if len(policy) >= capacity:
                policy.evict(1)
            policy.insert(f"scan{i}")
        assert all(key in policy for key in hot)

    def test_ghost_hit_in_b1_grows_t1_target_and_b2_shrinks_it(self) -> None:
        policy = self.filled([f"once{i}" for i in range(4)], capacity=4)
        assert policy.evict(2) == ["once0", "once1"]  # into B1
        assert policy.p == 0
        policy.insert("once0")  # T1 was too small for it
        assert policy.p == 1
        assert not policy.is_pinned("once0") and "once0" in policy
        # once0 came back from a ghost into T2; T1 (once2, once3) is above p = 1
        assert policy.evict(1) == ["once2"]
        assert policy.evict(1) == ["once0"]  # T1 is at its target: T2 gives, into B2
        policy.insert("once0")  # T2 was too small for it: p shrinks by |B1|/|B2| = 2
        assert policy.p == 0

    def test_adapts_toward_frequency_when_t2_ghosts_hit(self) -> None:
        capacity = 20
        policy = self.make(capacity)
        hot = [f"hot{i}" for i in range(15)]
        for key in hot:  # frequent set, slightly larger than T2 can keep at p near c
            policy.insert(key)
            policy.touch(key)
        for i in range(10):
            policy.insert(f"new{i}")
            policy.touch(f"new{i}")
        policy.p = float(capacity)  # pretend recency had been winning
        for round_ in range(30):
            for key in hot:
                if len(policy) >= capacity:
                    policy.evict(1)
                policy.insert(key)
                policy.touch(key)
            for i in range(3):
                if len(policy) >= capacity:
                    policy.evict(1)
                policy.insert(f"scan{round_}.{i}")
        assert policy.p < capacity / 2
        assert all(key in policy for key in hot)

    def test_ghost_lists_are_bounded_by_capacity(self) -> None:
        capacity = 50
        policy = self.make(capacity)
        for i in range(10_000):
            if len(policy) >= capacity:
                policy.evict(1)
            policy.insert(i)
            if i % 3 == 0:
                policy.touch(i)
            assert len(policy._b1) + len(policy._b2) <= capacity
            assert len(policy._t1) + len(policy._b1) <= capacity

    def test_capacity_none_learns_the_size_from_evictions(self) -> None:
        policy = self.filled(list(range(30)))
        for i in range(30, 1_000):
            policy.evict(1)
            policy.insert(i)
        assert len(policy._b1) + len(policy._b2) <= 30

    def test_pin_remembers_the_list_and_a_use_while_pinned_promotes(self) -> None:
        policy = self.filled(["a", "b", "c"], capacity=3)
        policy.touch("c")  # T2
        policy.pin("a")
        policy.pin("c")
        policy.touch("a")  # used while pinned: belongs to T2 now
        policy.unpin("a")
        policy.unpin("c")
        assert policy.evict(3) == ["b", "a", "c"]

    def test_pinned_t1_entries_count_toward_t1_size(self) -> None:
        policy = self.filled(["t2a", "t2b"], capacity=6)
        policy.touch("t2a")
        policy.touch("t2b")
        for key in ["x", "y", "z"]:
            policy.insert(key)
        policy.p = 3.0
        policy.pin("x")
        policy.pin("y")
        # T1 holds x, y (pinned) and z: three entries, not above p = 3, so T2 goes first
        assert policy.evict(1) == ["t2a"]
        policy.p = 2.0
        assert policy.evict(1) == ["z"]

    def test_export_follows_the_target_size(self) -> None:
        policy = self.filled(["a", "b", "c", "d"], capacity=4)
        assert policy.evict(2) == ["a", "b"]
        policy.insert("a")  # B1 hit: p = 1, a in T2
        policy.insert("x")  # T1 = c, d, x: two above p before T2's turn
        state = policy.export()
        assert state == ["c", "d", "a", "x"]
        assert policy.evict(4) == state
