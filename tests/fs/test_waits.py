"""`IntentWaits` on its own, over a scripted store: each wait ends exactly once,
with what the other intent's end says - and never with "stored" before a commit."""

from __future__ import annotations

import threading
from typing import Any

from kvtiers.contract.clock import ManualClock
from kvtiers_fs.namespace.waits import ABSENT, COMMITTED, PENDING, IntentWaits
from kvtiers_fs.namespace.write_verdict import WriteVerdict

OTHER = 0xB


class Host:
    """A store whose intents the test moves by hand."""

    writer = 0xA

    def __init__(self) -> None:
        self.state: dict[bytes, tuple[str, int]] = {}
        self.reserve_answers: list[WriteVerdict] = []
        self.reserved: list[bytes] = []
        self.dead_checks: list[int] = []
        self.lock = threading.Lock()

    def sync(self) -> None:
        pass

    def intent_state(self, idn: bytes) -> tuple[str, int]:
        with self.lock:
            return self.state.get(idn, (ABSENT, 0))

    def reserve(self, items: list[tuple[bytes, int]]) -> tuple[list[WriteVerdict], int]:
        with self.lock:
            self.reserved.append(items[0][0])
            return [self.reserve_answers.pop(0)], 0

    def settle_if_dead(self, writer: int) -> None:
        self.dead_checks.append(writer)


class Results:
    def __init__(self) -> None:
        self.got: dict[bytes, list[WriteVerdict]] = {}
        self.cv = threading.Condition()

    def done(self, idn: bytes) -> Any:
        def call(verdict: WriteVerdict) -> None:
            with self.cv:
                self.got.setdefault(idn, []).append(verdict)
                self.cv.notify_all()
        return call

    def wait(self, n: int) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: sum(map(len, self.got.values())) >= n, 10)


def test_each_wait_ends_once_with_its_own_verdict() -> None:
    host, results, clock = Host(), Results(), ManualClock()
    waits = IntentWaits(host, lambda op, exc: None)
    a, b, c, d = b"a" * 36, b"b" * 36, b"c" * 36, b"d" * 36
    host.state = {k: (PENDING, OTHER) for k in (a, b, c, d)}
    host.reserve_answers = [WriteVerdict.PENDING, WriteVerdict.GRANTED]
    for k in (a, b, c):
        waits.add(k, 100, None, clock, results.done(k))
    waits.add(d, 100, clock() + 5, clock, results.done(d))
    with host.lock:
        host.state[a] = (COMMITTED, 0)  # the other writer committed
    results.wait(1)
    assert results.got == {a: [WriteVerdict.PRESENT]}
    with host.lock:
        host.state[b] = (ABSENT, 0)  # ... failed: a third writer takes it first, then us
    clock.advance(10)
    results.wait(3)
    assert results.got[d] == [WriteVerdict.TIMEOUT]
    assert results.got[b] == [WriteVerdict.GRANTED] and host.reserved == [b, b]
    assert OTHER in host.dead_checks  # a pending writer is checked for death
    waits.close()
    assert results.got[c] == [WriteVerdict.CLOSED]
    assert sum(map(len, results.got.values())) == 4  # exactly once each
    waits.add(a, 100, None, clock, results.done(b"late"))
    assert results.got[b"late"] == [WriteVerdict.CLOSED]
