"""Slot allocation for a CPU pool: a stack of free slot numbers in one int64
array (8 bytes per slot, no Python object per slot), O(1) per slot."""

from __future__ import annotations

from array import array


class SlotAllocator:
    """Hands out slot numbers 0..num_slots-1. Single-threaded (the scheduler's)."""

    def __init__(self, num_slots: int):
        if num_slots < 0:
            raise ValueError("num_slots must be >= 0")
        self.num_slots = num_slots
        # Lowest slot numbers on top so a fresh pool fills from the start.
        self._free = array("q", range(num_slots - 1, -1, -1))

    @property
    def free_count(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """`n` free slots, or None (and nothing taken) when fewer are free."""
        free = self._free
        if n > len(free):
            return None
        if n == 0:
            return []
        taken = free[-n:].tolist()
        del free[-n:]
        return taken

    def allocate_one(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, slots: list[int] | tuple[int, ...]) -> None:
        """Return slots. The caller guarantees each is currently allocated."""
        self._free.extend(slots)

    def reset(self) -> None:
        self._free = array("q", range(self.num_slots - 1, -1, -1))
