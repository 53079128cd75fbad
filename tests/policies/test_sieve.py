"""SIEVE: the shared contract, the hand, and scan resistance."""

from __future__ import annotations

from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.policies.lru import LRUPolicy
from kvtiers.policies.sieve import SievePolicy

from .mixin import PolicyContract


def run_scan(policy: EvictionPolicy, capacity: int, hot: list[str], scan: int, reuse: bool) -> int:
    """Fill with a used working set `hot` plus cold filler, stream `scan` one-time keys
    through (evicting one per insert, as a full pool does), optionally using the
    working set now and then; return how many working-set keys survive."""
    for key in hot:
        policy.insert(key)
        policy.touch(key)
    for i in range(capacity - len(hot)):
        policy.insert(f"filler{i}")
    for i in range(scan):
        if len(policy) >= capacity:
            policy.evict(1)
        policy.insert(f"scan{i}")
        if reuse and i % 25 == 0:
            for key in hot:
                policy.touch(key)
    return sum(key in policy for key in hot)


class TestSieve(PolicyContract):
    policy_cls = SievePolicy

    def test_hand_passes_over_visited_entries_once(self) -> None:
        policy = self.filled(["a", "b", "c"])
        policy.touch("a")
        assert policy.evict(1) == ["b"]  # a was visited: its bit is cleared, it stays
        assert policy.evict(1) == ["c"]
        assert policy.evict(1) == ["a"]  # the hand wrapped; a was not used again

    def test_survivors_keep_their_place_and_new_entries_wait_at_the_head(self) -> None:
        policy = self.filled(["a", "b", "c", "d"])
        policy.touch("a")
        policy.touch("c")
        assert policy.evict(1) == ["b"]  # hand now between c and d
        policy.insert("e")
        policy.touch("a")  # behind the hand: used again before the hand comes back
        assert policy.evict(4) == ["d", "e", "c", "a"]

    def test_unpinned_entry_goes_to_the_head_with_its_bit(self) -> None:
        policy = self.filled(["a", "b", "c"])
        policy.pin("a")
        policy.touch("a")  # a use while pinned is remembered
        policy.unpin("a")
        assert policy.evict(3) == ["b", "c", "a"]
        policy = self.filled(["a", "b", "c"])
        policy.pin("a")
        policy.unpin("a")
        policy.touch("c")
        assert policy.evict(3) == ["b", "a", "c"]

    def test_one_time_scan_does_not_flush_the_working_set(self) -> None:
        hot = [f"hot{i}" for i in range(50)]
        assert run_scan(SievePolicy(100), 100, hot, scan=5_000, reuse=False) == len(hot)
        assert run_scan(SievePolicy(100), 100, hot, scan=5_000, reuse=True) == len(hot)
        # The same stream through LRU flushes it whole unless it keeps being used.
        assert run_scan(LRUPolicy(100), 100, hot, scan=5_000, reuse=False) == 0

    def test_export_folds_visited_bits_into_the_order(self) -> None:
        policy = self.filled(["a", "b", "c", "d"])
        policy.touch("a")
        assert policy.evict(1) == ["b"]  # ahead: c, d; behind: a
        policy.touch("a")
        policy.touch("d")
        # c goes first; d and a are passed over once (bits cleared), then taken.
        assert policy.export() == ["c", "d", "a"]
        assert policy.evict(3) == ["c", "d", "a"]
