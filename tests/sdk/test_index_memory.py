"""BoundedIndex at scale: no per-entry object the garbage collector tracks, the
use-order listing in pieces, and pin counts kept apart from the entries."""

from __future__ import annotations

import gc
import os

from kvtiers.policies.lru import LRUPolicy
from kvtiers.sdk import BoundedIndex


def _keys(n: int) -> list[bytes]:
    return [os.urandom(20) for _ in range(n)]


def test_entries_add_no_object_the_collector_tracks() -> None:
    index: BoundedIndex[int] = BoundedIndex(LRUPolicy(), 1 << 40, queued=True)
    keys = _keys(20_000)
    gc.collect()
    before = len(gc.get_objects())
    for at in range(0, len(keys), 256):
        index.adopt((k, 4160, 4160) for k in keys[at : at + 256])
    gc.collect()
    assert len(index) == len(keys)
    assert len(gc.get_objects()) - before < 100  # not one per entry


def _young(obj: object) -> bool:
    return any(o is obj for gen in (0, 1) for o in gc.get_objects(generation=gen))


def test_a_filled_index_is_not_left_in_the_young_generations() -> None:
    """A start-up load allocates almost nothing the collector tracks, so containers
    born young would stay young while they fill, and the first busy phase's
    generation-1 collection would walk them whole (~50 ms per million entries
    holding the GIL: issue 11's catch-up stall). The index's dict and its policy's
    are in the oldest generation before the first entry goes in."""
    assert gc.isenabled()
    policy = LRUPolicy()
    index: BoundedIndex[int] = BoundedIndex(policy, 1 << 40, queued=True)
    for _ in range(0, 50_000, 256):
        index.adopt((k, 4160, 4160) for k in _keys(256))
    assert len(index) >= 50_000 - 10
    containers = [index._entries, policy._order]
    assert all(gc.is_tracked(c) for c in containers)
    assert not any(_young(c) for c in containers)


def test_iter_items_lists_in_use_order_in_pieces_and_holds_the_lock() -> None:
    index: BoundedIndex[int] = BoundedIndex(LRUPolicy(), 1 << 40, queued=True)
    keys = _keys(1000)
    index.adopt((k, i, 10) for i, k in enumerate(keys))
    index.touch([keys[3], keys[0]])
    pieces = index.iter_items(256)
    first = next(pieces)
    assert len(first) == 256
    index.touch([keys[5]])  # queued: the listing is not disturbed
    assert index.queued >= 1
    rest = [e for piece in pieces for e in piece]
    listed = [k for k, _, _ in first + rest]
    expected = [k for k in keys if k not in (keys[0], keys[3])] + [keys[3], keys[0]]
    assert listed == expected
    assert all(loc == keys.index(k) and size == 10 for k, loc, size in first + rest)
    assert index.apply_queued() >= 1  # the lock is free again
    assert [k for piece in index.iter_items() for k, _, _ in piece][-1] == keys[5]


def test_a_release_never_unpins_a_newer_entry_under_the_same_key() -> None:
    for queued in (False, True):
        index: BoundedIndex[str] = BoundedIndex(LRUPolicy(), 100, queued=queued)
        index.add(b"k", "old", 10)
        old = index.pin([b"k"])
        index.apply_queued()
        assert index.remove(b"k") == "old"
        index.add(b"k", "new", 10)
        new = index.pin([b"k"])
        old.release()
        index.apply_queued()
        view = index.view()
        assert view.entries[b"k"].pins == 1 and view.evictable_bytes == 0
        new.release()
        index.apply_queued()
        view = index.view()
        assert view.entries[b"k"].pins == 0 and view.evictable_bytes == 10
