"""`second_touch`: a block is cascaded to the tier only when it has been touched
before within the window - it proved reuse - never on its first touch. A touch is
an offer (the manager would cascade it) or a use (a hit in the CPU pool, `used`).

Why: every write to an object store costs a request (and money), and most blocks of
a serving workload are never read again. A block offered twice was needed again
after its pool copy went (write_through: it was computed and stored a second time;
write_back: it was evicted a second time); that is the block a secondary tier
would have served.

A use counts: a block stored once and then hit in the pool is admitted at its
next offer (write_back: its eviction), and under write_through the manager offers
a refused block again at its next pool hit (`AdmissionPolicy`), so a shared
prefix that stays resident still reaches the tier, where other engines find it.

The memory of first touches is a doorkeeper in TinyLFU's style: two Bloom filters of
fixed size (the current and the previous generation). A key is "seen" when either
has it; a first offer sets its bits in the current one; after `window_blocks` first
offers the current generation becomes the previous one and a fresh one starts, so
a first offer is remembered for at least `window_blocks` and at most twice that
many further first offers. Memory: 2 x `bits_per_key` x `window_blocks` bits,
rounded up to a power of two (2 MiB per generation for a million keys at 10 bits
a key), whatever the number of keys offered. False positives (under 1% at 10 bits
and 4 probes) admit a block on its first offer: never a wrong result, only a PUT of a block not yet
proven. An admitted block's bits stay: a block evicted from the tier and offered
again is admitted at once while the window remembers it.

The probe positions come from the key's Python hash (bytes cache it, and the
manager's dictionaries have computed it already; it is per process, as the
doorkeeper is), its two 32-bit halves combined as in Kirsch-Mitzenmacher. O(1)
per offer: 4 probes of one `bytearray`; once per window the retired generation is
cleared (one C-speed fill of its bytes).
"""

from __future__ import annotations

from kvtiers.admission.base import AdmissionPolicy
from kvtiers.contract.keys import BlockKey

__all__ = ["DEFAULT_WINDOW", "MAX_WINDOW", "MIN_WINDOW", "SecondTouch"]

DEFAULT_WINDOW = 1 << 20  # keys, when neither the options nor the tier say
MIN_WINDOW = 1 << 12
MAX_WINDOW = 1 << 24  # 2 x 32 MiB at 10 bits a key
PROBES = 4  # `admit` is unrolled for this many
_M64 = (1 << 64) - 1


class SecondTouch(AdmissionPolicy):
    name = "second_touch"

    def __init__(self, capacity_blocks: int | None = None, *,
                 window_blocks: int | None = None, bits_per_key: int = 10):
        super().__init__(capacity_blocks)
        if window_blocks is None:
            window_blocks = DEFAULT_WINDOW if capacity_blocks is None else capacity_blocks
            window_blocks = min(MAX_WINDOW, max(MIN_WINDOW, window_blocks))
        if window_blocks < 1:
            raise ValueError(f"window_blocks must be positive, got {window_blocks}")
        self.window_blocks = window_blocks
        # A power of two of bits: the modulo is a mask.
        self._bits = max(64, 1 << (window_blocks * bits_per_key - 1).bit_length())
        self._mask = self._bits - 1
        self._current = bytearray(self._bits // 8)
        self._previous = bytearray(self._bits // 8)
        self._added = 0  # first offers in the current generation
        self.admitted = 0
        self.refused = 0

    @property
    def memory_bytes(self) -> int:
        return len(self._current) + len(self._previous)

    def admit(self, key: BlockKey) -> bool:
        if self._touch(key):
            self.admitted += 1
            return True
        self.refused += 1
        return False

    def used(self, key: BlockKey) -> None:
        self._touch(key)

    def _touch(self, key: BlockKey) -> bool:
        """Whether `key` was touched before (within the window); remembers it if not."""
        # Unrolled (PROBES = 4): this runs on the scheduler thread for every block.
        h = hash(key) & _M64
        b = ((h >> 32) | (h << 32)) & _M64 | 1
        mask = self._mask
        p0, p1, p2, p3 = h & mask, (h + b) & mask, (h + 2 * b) & mask, (h + 3 * b) & mask
        cur = self._current
        if (cur[p0 >> 3] >> (p0 & 7)) & (cur[p1 >> 3] >> (p1 & 7)) \
                & (cur[p2 >> 3] >> (p2 & 7)) & (cur[p3 >> 3] >> (p3 & 7)) & 1:
            return True
        prev = self._previous
        if (prev[p0 >> 3] >> (p0 & 7)) & (prev[p1 >> 3] >> (p1 & 7)) \
                & (prev[p2 >> 3] >> (p2 & 7)) & (prev[p3 >> 3] >> (p3 & 7)) & 1:
            return True
        cur[p0 >> 3] |= 1 << (p0 & 7)
        cur[p1 >> 3] |= 1 << (p1 & 7)
        cur[p2 >> 3] |= 1 << (p2 & 7)
        cur[p3 >> 3] |= 1 << (p3 & 7)
        self._added += 1
        if self._added >= self.window_blocks:
            prev[:] = bytes(len(prev))  # C-speed clear, once per window
            self._previous, self._current = cur, prev
            self._added = 0
        return False
