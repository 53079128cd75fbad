"""`GhostLists`: ARC's two ghost lists (B1, B2) in flat arrays.

A ghost is the 64-bit `hash()` of an evicted key, remembered in one of two FIFO
lists: membership tests, appends at the newest end, removal of any ghost (a ghost
hit) and removal of the oldest. `ARCPolicy` keeps them as ordered dicts of ints,
~130 bytes per ghost (the dict entry, its links, the int object); here they cost
~20-40: an open-addressing table (linear probing, backward-shift deletion, never
more than half full) of int64 hashes with a uint32 tag each, and one int64 ring per
list, oldest first.

The tag is the ghost's list and its sequence number in that list's ring (mod 2^31).
A ghost removed by a hit leaves its ring entry behind; when that entry reaches the
front it no longer matches its table entry's tag and is skipped, so the rings hold
each live ghost once plus stale entries that are dropped as the front passes them:
O(1) amortised per operation. Hash 0 marks an empty table cell, so a key hashing to
0 is remembered as 1 (a collision, which only misguides ARC's adaptation once).

`ghost_lists()` gives the C form (`kvtiers.policies._slotlinks.Ghosts`, same
methods and answers) when it was built, else this class.

Single-threaded, like the policy that owns it.
"""

from __future__ import annotations

from array import array
from typing import cast

from kvtiers.policies import slot_links

_SEQ_MASK = 0x7FFFFFFF


class GhostLists:
    """Two FIFO lists of hashes, numbered 1 and 2; a hash is in at most one."""

    def __init__(self) -> None:
        self._mask = 7
        self._hashes = array("q", bytes(8 * 8))
        self._tags = array("I", bytes(4 * 8))
        self._live = 0
        self._rings = (array("q"), array("q"))
        self._offset = [0, 0]  # sequence number of each ring's element 0
        self._front = [0, 0]  # index of each ring's oldest entry not yet dropped
        #: live ghosts in list 1 (B1) and list 2 (B2)
        self.len1 = 0
        self.len2 = 0

    def __len__(self) -> int:
        return self._live

    def _find(self, h: int) -> int:
        """The table cell of `h` (nonzero), or -1."""
        mask, hashes = self._mask, self._hashes
        i = h & mask
        while True:
            x = hashes[i]
            if x == h:
                return i
            if not x:
                return -1
            i = (i + 1) & mask

    def find(self, h: int) -> int:
        """1 or 2: the list that has `h`; 0: neither."""
        i = self._find(h or 1)
        return 0 if i < 0 else (self._tags[i] & 1) + 1

    def add(self, which: int, h: int) -> None:
        """Append `h` at the newest end of list `which` (1 or 2); a hash already
        remembered (in either list) stays where it is."""
        h = h or 1
        if self._find(h) >= 0:
            return
        if 2 * (self._live + 1) > self._mask + 1:
            self._grow()
        ring = self._rings[which - 1]
        seq = self._offset[which - 1] + len(ring)
        ring.append(h)
        mask, hashes = self._mask, self._hashes
        i = h & mask
        while hashes[i]:
            i = (i + 1) & mask
        hashes[i] = h
        self._tags[i] = ((seq & _SEQ_MASK) << 1) | (which - 1)
        self._live += 1
        if which == 1:
            self.len1 += 1
        else:
            self.len2 += 1

    def discard(self, h: int) -> None:
        """Forget `h` (a ghost hit); its ring entry goes stale."""
        i = self._find(h or 1)
        if i >= 0:
            if self._tags[i] & 1:
                self.len2 -= 1
            else:
                self.len1 -= 1
            self._delete_at(i)

    def pop_oldest(self, which: int) -> None:
        """Forget the oldest ghost of list `which` (none: nothing happens)."""
        w = which - 1
        ring, front, offset = self._rings[w], self._front[w], self._offset[w]
        tags = self._tags
        while front < len(ring):
            h = ring[front]
            tag = (((offset + front) & _SEQ_MASK) << 1) | w
            front += 1
            i = self._find(h)
            if i >= 0 and tags[i] == tag:
                self._delete_at(i)
                if w:
                    self.len2 -= 1
                else:
                    self.len1 -= 1
                break
        if front > 1024 and 2 * front > len(ring):
            del ring[:front]
            self._offset[w] = offset + front
            front = 0
        self._front[w] = front

    def _delete_at(self, i: int) -> None:
        """Empty cell `i`, shifting later entries of its probe run back (no
        tombstones: lookups stay short however many ghosts come and go)."""
        mask, hashes, tags = self._mask, self._hashes, self._tags
        j = i
        while True:
            j = (j + 1) & mask
            x = hashes[j]
            if not x:
                break
            k = x & mask  # where x wants to be: it may move to i unless k is in (i, j]
            if (k <= i or k > j) if i < j else (k <= i and k > j):
                hashes[i] = x
                tags[i] = tags[j]
                i = j
        hashes[i] = 0
        self._live -= 1

    def _grow(self) -> None:
        old_h, old_t = self._hashes, self._tags
        size = 2 * (self._mask + 1)
        mask = size - 1
        hashes = array("q", bytes(8 * size))
        tags = array("I", bytes(4 * size))
        for h, tag in zip(old_h, old_t, strict=True):
            if h:
                i = h & mask
                while hashes[i]:
                    i = (i + 1) & mask
                hashes[i] = h
                tags[i] = tag
        self._mask, self._hashes, self._tags = mask, hashes, tags

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]


def ghost_lists() -> GhostLists:
    """New, empty ghost lists: the C `Ghosts` when built and
    `slot_links.USE_NATIVE`, else `GhostLists`."""
    c = slot_links.native()
    return GhostLists() if c is None else cast("GhostLists", c.Ghosts())
