"""`BlockIndex`: the fold of journal records, ownership of intents, pins counted by
the core's `BoundedIndex` (one owner of pin counts) and honoured by eviction,
capacity shared with every writer's intents, install with pins kept."""

from __future__ import annotations

from kvtiers.policies.lru import LRUPolicy
from kvtiers.testing import random_keys
from kvtiers_fs.journal import records as jr
from kvtiers_fs.journal.index import BlockIndex
from kvtiers_fs.journal.records import Record

A, B = 0xA, 0xB


def _idns(n: int) -> list[bytes]:
    return random_keys(n)


def _index(capacity: int = 1 << 40) -> BlockIndex:
    return BlockIndex(LRUPolicy(), capacity)


def _committed(index: BlockIndex, writer: int, idns: list[bytes], size: int = 100) -> None:
    index.apply([Record(jr.ADD, writer, size, i) for i in idns])
    index.apply([Record(jr.COMMIT, writer, size, i) for i in idns])


def _order(index: BlockIndex) -> list[bytes]:
    return [i for piece in index.entries() for i, _ in piece]


def test_an_intent_ends_only_by_its_own_writer() -> None:
    index = _index()
    x, y = _idns(2)
    index.apply([Record(jr.ADD, A, 100, x), Record(jr.ADD, A, 100, y)])
    assert index.usage == 200 and index.reserved == 2
    index.apply([Record(jr.COMMIT, B, 100, x), Record(jr.ABORT, B, 0, y)])  # not B's
    assert index.reserved == 2 and not index.contains(x)
    index.apply([Record(jr.COMMIT, A, 100, x), Record(jr.ABORT, A, 0, y)])
    assert index.contains(x) and not index.contains(y)
    assert (index.usage, index.reserved, index.blocks) == (100, 0, 1)
    assert index.committed_bytes() == 100 and index.bounded.reserved_bytes == 0
    # A second ADD of a committed block is no intent (reserve never writes one).
    index.apply([Record(jr.ADD, B, 100, x)])
    assert index.reserved == 0 and index.usage == 100


def test_a_commit_of_an_intent_a_rebuild_dropped_indexes_the_block() -> None:
    index = _index()
    (x,) = _idns(1)
    index.apply([Record(jr.COMMIT, A, 100, x)])
    assert index.contains(x) and index.usage == 100
    index.apply([Record(jr.COMMIT, A, 0, _idns(1)[0])])  # no size: nothing to go on
    assert index.blocks == 1


def test_removals_are_reported_and_order_is_least_recently_used_first() -> None:
    index = _index()
    idns = _idns(5)
    _committed(index, A, idns)
    index.apply([Record(jr.TOUCH, A, 0, idns[0])])
    assert _order(index) == [*idns[1:], idns[0]]
    index.touch([idns[1]])
    assert index.queued() > 0  # the scheduler's touch is queued, not applied
    assert _order(index) == [*idns[2:], idns[0], idns[1]]  # applied before any read
    index.drain()
    assert index.take_touched() == [idns[1]]  # for the journal
    index.apply([Record(jr.REMOVE, B, 100, idns[2]), Record(jr.FORGET, B, 100, idns[3]),
                 Record(jr.REMOVE, B, 100, _idns(1)[0])])  # the last one: not held
    assert index.take_removed() == idns[2:4] and index.take_removed() == []
    assert index.last_deletes[B][0] == idns[2]  # to redo if B died before unlinking
    index.apply([Record(jr.GONE, A, B, b"")])
    assert B not in index.last_deletes


def test_pins_are_counted_in_the_bounded_index_and_honoured_by_eviction() -> None:
    index = _index(400)
    idns = _idns(4)
    _committed(index, A, idns)
    first, again, second = index.pin([idns[0]]), index.pin([idns[0]]), index.pin([idns[1]])
    again.release()  # still pinned once
    again.release()  # idempotent
    victims = index.make_room(300)
    assert victims is None  # 300 more bytes would need a pinned block: nothing evicted
    assert index.blocks == 4 and index.take_removed() == []
    victims = index.make_room(200)
    assert victims is not None and sorted(v for v, _ in victims) == sorted(idns[2:])
    assert index.usage == 400 and index.take_removed() == idns[2:]
    pins = index.bounded.view().entries
    assert (pins[idns[0]].pins, pins[idns[1]].pins) == (1, 1)  # the one count there is
    first.release()
    second.release()
    index.bounded.release(200)
    got = index.make_room(300)
    assert got is not None and {v for v, _ in got} <= set(idns[:2]) and got


def test_every_writers_intents_count_against_capacity() -> None:
    index = _index(300)
    idns = _idns(3)
    _committed(index, A, idns[:2])
    index.apply([Record(jr.ADD, B, 100, idns[2])])  # another process's intent: no eviction
    assert (index.usage, index.blocks) == (300, 2)
    got = index.make_room(100)  # ours: evicts the oldest, never B's intent
    assert got == [(idns[0], 100)] and index.usage == 300


def test_put_back_undoes_an_eviction_that_could_not_be_journaled() -> None:
    index = _index(200)
    idns = _idns(2)
    _committed(index, A, idns)
    got = index.make_room(100)
    assert got is not None and len(got) == 1 and not index.contains(got[0][0])
    assert index.usage == 200  # one block, and the 100 bytes held for the intent
    index.put_back(got, 100)
    assert index.contains(got[0][0]) and index.usage == 200
    assert index.take_removed() == []  # it never left, as far as anyone is told


def test_install_replaces_the_index_keeps_pins_and_reports_what_went() -> None:
    index = _index(300)
    idns = _idns(4)
    _committed(index, A, idns)  # 400 bytes: adopted as committed, past the capacity
    pins = index.pin([idns[0]])
    index.take_removed()
    records = [(jr.ENTRY, len(i), 0, 100, i.ljust(40, b"\0")) for i in idns[:2]]
    records.append((jr.ADD, len(idns[3]), B, 100, idns[3].ljust(40, b"\0")))
    index.install(records, report=True)
    assert index.blocks == 2 and index.reserved == 1 and index.usage == 300
    assert sorted(index.take_removed()) == sorted(idns[2:])
    assert index.bounded.view().entries[idns[0]].pins == 1  # kept through the install
    assert index.make_room(100) == [(idns[1], 100)]  # idns[0] is still pinned
    pins.release()
    assert index.bounded.view().entries[idns[0]].pins == 0


def test_install_without_report_tells_nothing() -> None:
    index = _index()
    idns = _idns(3)
    _committed(index, A, idns)
    index.install([(jr.ENTRY, len(idns[0]), 0, 100, idns[0].ljust(40, b"\0"))], report=False)
    assert index.blocks == 1 and index.take_removed() == [] and index.usage == 100
