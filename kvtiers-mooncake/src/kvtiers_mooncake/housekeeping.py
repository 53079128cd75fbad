"""`Housekeeper`: the tier's background thread - removals that wait for leases,
and keeping the index true to what the store holds.

- **removals**: evicted blocks and damaged objects are removed with
  `batch_remove`; Mooncake refuses to remove an object read in the last lease
  period (`OBJECT_HAS_LEASE`, 10 s by default), so what it refuses is asked
  again every `PAUSE_S` until it goes (or is found gone). Their bytes count in
  the tier's usage until then (`leaving_bytes`), so `stats()` says what the store
  holds for this engine. A name being removed is `in` the housekeeper: a store of
  its key waits for the removal.
- **reconcile** (after the breaker closes again: the master may have restarted
  and lost everything, a segment may have gone): every indexed key is asked
  with `batch_is_exist`, and the ones gone leave the index.
- **refresh** (with `admin_address` and `refresh_s`): the master's key listing
  (`admin.all_keys`, no leases) every `refresh_s`; indexed keys it lacks (the
  master evicted them) leave the index.

Blocks that leave the index this way are reported to `ctx.events` by the index
(`on_removed`); the master's own evictions are only seen this way, or as misses.
Thread-safe; `remove`, `__contains__` and `leaving_bytes` never block on I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from kvtiers.sdk import BoundedIndex, ErrorCounts

from kvtiers_mooncake import admin
from kvtiers_mooncake.client import HAS_LEASE, NOT_FOUND, BreakerOpen, StoreClient
from kvtiers_mooncake.names import Names

__all__ = ["Housekeeper"]

PAUSE_S = 0.5
EXIST_PIECE = 1024


class Housekeeper:
    def __init__(self, client: StoreClient, index: BoundedIndex[None], names: Names,
                 errors: ErrorCounts, *, name: str, refresh_s: float = 0.0,
                 admin_address: str | None = None, timeout_s: float = 5.0,
                 on_gone: Callable[[int], None] | None = None):
        self.client = client
        self.index = index
        self.names = names
        self.errors = errors
        self.refresh_s = refresh_s if admin_address else 0.0
        self.admin_address = admin_address
        self.timeout_s = timeout_s
        self.on_gone = on_gone
        self._cv = threading.Condition()
        self._leaving: dict[str, int] = {}  # name -> bytes it counts in usage
        self._leaving_bytes = 0
        self._reconcile = False
        self._closed = False
        self.removed = 0  # objects removed (evicted or damaged)
        self.damaged_removed = 0
        self.dropped = 0  # index entries found gone (master evictions, lost segments)
        self._thread = threading.Thread(target=self._run, name=f"{name}-housekeeping",
                                        daemon=True)
        self._thread.start()

    def __contains__(self, name: object) -> bool:
        return name in self._leaving

    def among(self, names: list[str]) -> set[str]:
        """Those of `names` being removed now (one set operation for a unit)."""
        leaving = self._leaving
        return leaving.keys() & names if leaving else set()

    @property
    def leaving_bytes(self) -> int:
        return self._leaving_bytes

    def leaving(self) -> list[str]:
        """Names still to be removed (a copy)."""
        with self._cv:
            return list(self._leaving)

    def remove_now(self, names: Sequence[str], bytes_each: int) -> None:
        """Remove these objects now, on the calling thread (a store making room: the
        room is there before its put); what a lease or an outage keeps is left to
        the thread (`remove`)."""
        if not names:
            return
        try:
            codes = self.client.remove(names)
        except Exception:  # noqa: BLE001 - the thread asks again
            codes = [-1] * len(names)
        left = [n for n, c in zip(names, codes, strict=True) if c not in (0, NOT_FOUND)]
        with self._cv:
            self.removed += sum(1 for c in codes if c == 0)
        self.remove(left, bytes_each)

    def remove(self, names: Sequence[str], bytes_each: int, *, damaged: bool = False) -> None:
        """Remove these objects as soon as their leases allow; `bytes_each` is what
        each counted in usage until now (0: not ours to count)."""
        if not names:
            return
        with self._cv:
            for name in names:
                if name not in self._leaving:
                    self._leaving[name] = bytes_each
                    self._leaving_bytes += bytes_each
            if damaged:
                self.damaged_removed += len(names)
            self._cv.notify()

    def reconcile(self) -> None:
        """Check every indexed key against the store soon (after an outage)."""
        with self._cv:
            self._reconcile = True
            self._cv.notify()

    def idle(self) -> bool:
        with self._cv:
            return not self._leaving and not self._reconcile

    def close(self, timeout: float) -> None:
        """Stop, after one last try at what is left to remove (bounded)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)

    # The thread.

    def _run(self) -> None:
        refreshed = time.monotonic()
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closed or self._reconcile or bool(self._leaving),
                                  timeout=PAUSE_S)
                closed, reconcile = self._closed, self._reconcile
                self._reconcile = False
                leaving = list(self._leaving)
            if leaving:
                self._remove(leaving)
            if closed:
                return
            if reconcile:
                self._check_index()
            if self.refresh_s and time.monotonic() - refreshed >= self.refresh_s:
                refreshed = time.monotonic()
                self._refresh()
            if leaving and not reconcile:
                with self._cv:  # what had a lease still has it for a while
                    self._cv.wait_for(lambda: self._closed or self._reconcile, PAUSE_S)

    def _remove(self, names: list[str]) -> None:
        try:
            codes = self.client.remove(names)
        except BreakerOpen:
            return
        except Exception as exc:  # noqa: BLE001 - asked again next round
            self.errors.record("remove", exc)
            return
        with self._cv:
            for name, code in zip(names, codes, strict=True):
                if code == 0 or code == NOT_FOUND:
                    self._leaving_bytes -= self._leaving.pop(name, 0)
                    self.removed += code == 0
                elif code != HAS_LEASE:
                    self.errors.note("remove", str(code), f"remove of {name}: code {code}")

    def _drop(self, keys: list[bytes]) -> None:
        for key in keys:
            self.index.remove(key)
        self.dropped += len(keys)
        if keys and self.on_gone is not None:
            self.on_gone(len(keys))

    def _check_index(self) -> None:
        keys = [k for k, _, _ in self.index.items()]
        for at in range(0, len(keys), EXIST_PIECE):
            piece = keys[at:at + EXIST_PIECE]
            try:
                codes = self.client.exist([self.names.block(k) for k in piece])
            except BreakerOpen:
                self.reconcile()  # again once it lets calls through
                return
            except Exception as exc:  # noqa: BLE001
                self.errors.record("reconcile", exc)
                self.reconcile()
                return
            self._drop([k for k, c in zip(piece, codes, strict=True) if c == 0])

    def _refresh(self) -> None:
        assert self.admin_address is not None
        before = {k for k, _, _ in self.index.items()}
        try:
            listed = set(admin.all_keys(self.admin_address, self.timeout_s))
        except Exception as exc:  # noqa: BLE001 - the next round tries again
            self.errors.record("refresh", exc)
            return
        # Only keys indexed before the listing began can be judged by it.
        self._drop([k for k in before if self.names.block(k) not in listed
                    and k in self.index])
