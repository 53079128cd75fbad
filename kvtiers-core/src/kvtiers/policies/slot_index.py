"""What the CPU pool's policies (`SlotLRUPolicy`, `SlotSievePolicy`,
`SlotARCPolicy`) share: values are slot numbers in `0..capacity-1`, each used by at
most one entry at a time, so an index maps key -> slot and everything else lives in
per-slot arrays the subclass lays out (links, flags).

The index: with the optional C helper (`kvtiers.policies._slotlinks`, see
`slot_links`) a `SlotIndex`, an open-addressing table of int32 slot numbers that
finds keys through the slot -> key list (~10 bytes per entry at the pool's size,
values returned as new ints); without it a plain dict (~52 bytes per entry plus an
int object per value). The policies write `keys[slot]` as the dict path needs it and
remove an entry from the index before clearing its key (the C index finds entries
through that list).

CPython dicts never shrink, and churn (insert + delete) makes them resize to 3x
their live size: `_count_inserts` rebuilds the dict in place every `len/2`
insertions, which keeps it at its compact size for about two entry copies per
insertion (and keeps the bound `get` valid); the C table never grows. Slot numbers
do not survive a restart, so these policies refuse `restore`: persistent tiers
restore the dict-based policies.
"""
from __future__ import annotations

from array import array
from collections.abc import Hashable
from typing import Any, ClassVar, cast

from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.policies import slot_links


class SlotIndexPolicy(EvictionPolicy):
    """Base of the slot policies: the key -> slot index, the slot -> key list, and
    the checks and bookkeeping every one of them does alike. Subclasses say where a
    pin is recorded (`is_pinned`) and what `restore` refuses in favour of."""

    #: The dict-based policy persistent tiers restore instead (for the message).
    restores_as: ClassVar[str] = "the dict-based policy of the same name"

    def __init__(self, capacity: int | None = None):
        if capacity is None or capacity < 0:
            raise ValueError(f"{type(self).__name__} needs the number of slots as its capacity")
        super().__init__(capacity)
        self._slots = capacity
        self._keys: list[Hashable | None] = [None] * capacity
        native = slot_links.native()
        # (The C index has the dict methods these policies use.)
        self._index: dict[Hashable, int] = (
            {} if native is None else cast("dict[Hashable, int]", native.SlotIndex(self._keys))
        )
        # Bound once: the manager calls `get` for every block it looks up.
        self.get = self._index.get  # type: ignore[method-assign, assignment]
        self._inserts = 0
        # The batch list moves (pin_many, ...): C when built, else Python.
        self._move = slot_links.move_function()
        self._gather = slot_links.gather_function()

    def _init_links(self, sentinels: int) -> None:
        """Doubly linked lists threaded through two int32 arrays indexed by slot,
        with `sentinels` list heads after the slots (`capacity`, `capacity + 1`,
        ...): `next[h]` is a list's oldest entry, `prev[h]` its newest."""
        size = self._slots + sentinels
        self._next = array("i", range(size))
        self._prev = array("i", range(size))

    # The list operations; the hot paths of the subclasses inline them.

    def _append(self, head: int, slot: int) -> None:
        prev, nxt = self._prev, self._next
        last = prev[head]
        nxt[last] = slot
        prev[slot] = last
        nxt[slot] = head
        prev[head] = slot

    def _unlink(self, slot: int) -> None:
        prev, nxt = self._prev, self._next
        p = prev[slot]
        n = nxt[slot]
        nxt[p] = n
        prev[n] = p

    def get(self, key: Hashable, default: Any = None) -> Any:
        # Shadowed per instance by the index's own bound `get` (see __init__).
        return self._index.get(key, default)

    def _check_slot(self, value: Any) -> None:
        if not isinstance(value, int) or not 0 <= value < self._slots:
            raise ValueError(f"value must be a slot number in 0..{self._slots - 1}, got {value!r}")

    def _count_inserts(self, n: int = 1) -> None:
        self._inserts += n
        if self._inserts > 1024 and self._inserts > len(self._index) // 2:
            self._compact()

    def _compact(self) -> None:
        index = self._index
        if type(index) is not dict:  # the C table never grows
            self._inserts = 0
            return
        fresh = dict(index)
        index.clear()
        index.update(fresh)
        self._inserts = 0

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def restore(self, state: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} holds slot numbers, which do not survive a restart; "
            f"persistent tiers restore {self.restores_as}"
        )
