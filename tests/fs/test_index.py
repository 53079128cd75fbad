"""`BlockIndex`: the fold of journal records, ownership of intents, queued pins and
touches, eviction that never takes a pinned block, install with pins kept."""

from __future__ import annotations

from kvtiers.policies.lru import LRUPolicy
from kvtiers.testing import random_keys
from kvtiers_fs import journal as jr
from kvtiers_fs.index import BlockIndex
from kvtiers_fs.journal import Record

A, B = 0xA, 0xB


def _idns(n: int) -> list[bytes]:
    return random_keys(n)


def _committed(index: BlockIndex, writer: int, idns: list[bytes], size: int = 100) -> None:
    index.apply([Record(jr.ADD, writer, size, i) for i in idns])
    index.apply([Record(jr.COMMIT, writer, size, i) for i in idns])


def test_an_intent_ends_only_by_its_own_writer() -> None:
    index = BlockIndex(LRUPolicy)
    x, y = _idns(2)
    index.apply([Record(jr.ADD, A, 100, x), Record(jr.ADD, A, 100, y)])
    assert index.usage == 200 and index.reserved == 2
    index.apply([Record(jr.COMMIT, B, 100, x), Record(jr.ABORT, B, 0, y)])  # not B's
    assert index.reserved == 2 and not index.contains(x)
    index.apply([Record(jr.COMMIT, A, 100, x), Record(jr.ABORT, A, 0, y)])
    assert index.contains(x) and not index.contains(y)
    assert (index.usage, index.reserved, index.blocks) == (100, 0, 1)
    # A second ADD of a committed block is no intent (reserve never writes one).
    index.apply([Record(jr.ADD, B, 100, x)])
    assert index.reserved == 0 and index.usage == 100


def test_a_commit_of_an_intent_a_rebuild_dropped_indexes_the_block() -> None:
    index = BlockIndex(LRUPolicy)
    (x,) = _idns(1)
    index.apply([Record(jr.COMMIT, A, 100, x)])
    assert index.contains(x) and index.usage == 100
    index.apply([Record(jr.COMMIT, A, 0, _idns(1)[0])])  # no size: nothing to go on
    assert index.blocks == 1


def test_removals_are_reported_and_order_is_least_recently_used_first() -> None:
    index = BlockIndex(LRUPolicy)
    idns = _idns(5)
    _committed(index, A, idns)
    index.apply([Record(jr.TOUCH, A, 0, idns[0])])
    index.touch([idns[1]])  # queued: not applied yet
    assert [i for piece in index.entries() for i, _ in piece] == [*idns[1:], idns[0]]
    index.drain()
    assert [i for piece in index.entries() for i, _ in piece] == [*idns[2:], idns[0], idns[1]]
    assert index.take_touched() == [idns[1]]
    index.apply([Record(jr.REMOVE, B, 100, idns[2]), Record(jr.FORGET, B, 100, idns[3]),
                 Record(jr.REMOVE, B, 100, _idns(1)[0])])  # the last one: not held
    assert index.take_removed() == idns[2:4] and index.take_removed() == []
    assert index.last_deletes[B][0] == idns[2]  # to redo if B died before unlinking
    index.apply([Record(jr.GONE, A, B, b"")])
    assert B not in index.last_deletes


def test_queued_pins_are_counted_and_honoured_by_eviction() -> None:
    index = BlockIndex(LRUPolicy)
    idns = _idns(4)
    _committed(index, A, idns)
    index.pin([idns[0], idns[0], idns[1]])
    index.unpin([idns[0]])  # still pinned once
    index.drain()
    victims = []
    while (got := index.evict_one()) is not None:
        victims.append(got[0])
    assert victims == idns[2:]  # the pinned ones are never victims
    assert index.usage == 200
    index.unpin([idns[0], idns[1]])
    index.drain()
    got = index.evict_one()
    assert got is not None and got[0] in idns[:2]


def test_put_back_undoes_an_eviction_that_could_not_be_journaled() -> None:
    index = BlockIndex(LRUPolicy)
    idns = _idns(2)
    _committed(index, A, idns)
    got = index.evict_one()
    assert got is not None and index.usage == 100 and not index.contains(got[0])
    index.put_back([got])
    assert index.contains(got[0]) and index.usage == 200


def test_install_replaces_the_index_keeps_pins_and_reports_what_went() -> None:
    index = BlockIndex(LRUPolicy)
    idns = _idns(4)
    _committed(index, A, idns)
    index.pin([idns[0]])
    index.drain()
    index.take_removed()
    records = [(jr.ENTRY, len(i), 0, 100, i.ljust(40, b"\0")) for i in idns[:2]]
    records.append((jr.ADD, len(idns[3]), B, 100, idns[3].ljust(40, b"\0")))
    index.install(records, report=True)
    assert index.blocks == 2 and index.reserved == 1 and index.usage == 300
    assert sorted(index.take_removed()) == sorted(idns[2:])
    victims = [got[0] for got in iter(index.evict_one, None)]
    assert victims == [idns[1]]  # idns[0] is still pinned
