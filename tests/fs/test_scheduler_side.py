"""The scheduler thread's calls never wait for work that grows with the number of
blocks (issue 11, item 5; DESIGN.md invariant 3): while another thread of the same
store is stuck in the middle of applying a long journal tail, or of writing a
snapshot, `contains`, `pin` (and its release), `touch` and `stats` still return.

The long work is made to stop half way (an eviction policy whose `insert` or
`export` blocks, or a snapshot write that blocks), so the tests count no time:
they only see whether the calls come back while it is stuck. The latency figures
are bench/fs_lookup_latency.py's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import kvtiers_fs.namespace.store as store_mod
import pytest
from kvtiers.policies.lru import LRUPolicy
from kvtiers.sdk import ErrorCounts
from kvtiers.testing import make_namespace, random_keys
from kvtiers_fs.disk import layout
from kvtiers_fs.namespace.store import RootStore

FILE = 8192
_log = logging.getLogger("test")


class Gate:
    """Blocks the first thread that reaches it until `open()`."""

    def __init__(self) -> None:
        self.armed = False
        self.reached = threading.Event()
        self._open = threading.Event()

    def __call__(self) -> None:
        if self.armed and not self.reached.is_set():
            self.reached.set()
            assert self._open.wait(30)

    def open(self) -> None:
        self._open.set()


class GatedLRU(LRUPolicy):
    def __init__(self, gate: Gate, capacity: int | None = None):
        super().__init__(capacity)
        self.gate = gate

    def insert(self, key: Hashable, value: Any = None) -> None:
        self.gate()
        super().insert(key, value)

    def export(self) -> list[Any]:
        self.gate()
        return super().export()


def _store(root: Path, policy: Callable[[], Any]) -> RootStore:
    store = RootStore(str(root), make_namespace("model-a", 4096), capacity_bytes=1 << 30,
                      policy_factory=policy, errors=ErrorCounts(_log, "kvtiers-fs t"), logger=_log)
    store.open()
    return store


def _commit(store: RootStore, n: int) -> list[bytes]:
    """n blocks reserved and committed (the index only: no files are needed)."""
    idns = [layout.ident(k) for k in random_keys(n)]
    for i in range(0, n, 50):
        store.reserve([(idn, FILE) for idn in idns[i : i + 50]])
        store.commit(idns[i : i + 50], [])
    return idns


def _scheduler_calls_return(store: RootStore, idns: list[bytes]) -> bool:
    """Whether the scheduler's calls all return (on a thread, so that a call that
    waits for the stuck work cannot hang the test)."""
    done = threading.Event()

    def calls() -> None:
        for idn in idns[:20]:
            store.contains(idn)
        pins = store.pin(idns[:5])
        store.touch(idns[5:10])
        pins.release()
        store.stats()
        done.set()

    threading.Thread(target=calls, daemon=True).start()
    return done.wait(10)


def test_scheduler_calls_return_while_a_long_catch_up_is_stuck(tmp_path: Path) -> None:
    writer = _store(tmp_path, LRUPolicy)
    gate = Gate()
    reader = _store(tmp_path, lambda: GatedLRU(gate))
    try:
        known = _commit(reader, 20)
        _commit(writer, 300)  # a tail the reader has not read yet
        gate.armed = True
        catch_up = threading.Thread(target=reader.sync, daemon=True)
        catch_up.start()
        assert gate.reached.wait(10), "the catch-up never applied a commit"
        assert _scheduler_calls_return(reader, known), \
            "the scheduler side waited for a journal tail to be applied"
        gate.open()
        catch_up.join(10)
        assert reader.stats()[1] == 320
    finally:
        gate.open()
        reader.close()
        writer.close()


def test_scheduler_calls_return_while_a_snapshot_is_being_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate()
    store = _store(tmp_path, lambda: GatedLRU(gate))
    try:
        idns = _commit(store, 200)
        monkeypatch.setattr(store_mod, "ROTATE_MIN_BYTES", 1)
        try:  # where the snapshot is written in pieces (this version)
            from kvtiers_fs.journal import files

            real = files.write_snapshot

            def gated(*args: Any, **kw: Any) -> None:
                gate()
                real(*args, **kw)

            monkeypatch.setattr(files, "write_snapshot", gated)
        except ImportError:
            pass
        gate.armed = True  # ... and the policy's export, for a version that uses it
        more = threading.Thread(target=_commit, args=(store, 100), daemon=True)
        more.start()  # grows the journal: a rotation starts
        assert gate.reached.wait(10), "no snapshot was written"
        assert _scheduler_calls_return(store, idns), \
            "the scheduler side waited for a snapshot to be written"
        gate.open()
        more.join(10)
        assert store.stats()[1] == 300
    finally:
        gate.open()
        store.close()
    again = _store(tmp_path, LRUPolicy)
    try:
        assert again.stats()[1] == 300
    finally:
        again.close()
