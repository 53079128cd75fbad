"""LRU: the shared contract plus its order."""

from __future__ import annotations

from kvtiers.policies.lru import LRUPolicy

from .mixin import PolicyContract


class TestLRU(PolicyContract):
    policy_cls = LRUPolicy

    def test_least_recently_used_goes_first(self) -> None:
        policy = self.filled(["a", "b", "c", "d"])
        policy.touch("a")
        policy.insert("b")  # re-inserting is a use
        assert policy.evict(4) == ["c", "d", "a", "b"]

    def test_unpinned_entry_comes_back_as_most_recent(self) -> None:
        policy = self.filled(["a", "b", "c"])
        policy.pin("a")
        policy.touch("b")
        policy.unpin("a")
        assert policy.evict(3) == ["c", "b", "a"]

    def test_export_is_oldest_first_then_pinned_in_pin_order(self) -> None:
        policy = self.filled(["a", "b", "c", "d"])
        policy.pin("c")
        policy.pin("a")
        assert policy.export() == ["b", "d", "c", "a"]
