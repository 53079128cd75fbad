"""The slot policies' per-key list moves, two ways: in Python here, and in C in the
optional `kvtiers.policies._slotlinks` (built by setup.py where there is a C
compiler). Both do exactly the same; `move` is the one the policies use.

`move(marks, prev, next, slots, table, heads) -> list[int]`: for each slot of
`slots` in order (None skipped), with `m = marks[slot]` and `t = table[m]`: 255 leaves
it alone; otherwise `marks[slot] = t` and, by the action byte `a = table[k + m]`
(`k = len(table) // 2`), `a & 1` unlinks the slot from its list, then `a & 2` links
it at the newest end of the list whose sentinel is `heads[t]`. Returns how many
slots moved per old mark (`k` counts). A policy describes its pin, unpin or touch as
one such table (`table(k, {old: (new, action)})`).

`gather(buffer, slots) -> bytes`: `buffer[s]` for each slot, as bytes (the pool's
states, a policy's marks), so that one `count` answers "are all READY".

The lists are threaded through `prev` and `next` (`array('i')`, indexed by slot,
sentinels after the slots: `next[h]` is a list's oldest entry, `prev[h]` its
newest); `marks` is a bytearray indexed by slot. A slot out of range raises
IndexError, a mark at or above `k` ValueError. Single-threaded, like the policy.
Set `KVTIERS_PURE_PYTHON=1` (before the first import; or `USE_NATIVE = False` before
a policy is built) to use the Python loop and `GhostLists`.
"""

from __future__ import annotations

from collections.abc import Callable, MutableSequence, Sequence
from typing import Any

from kvtiers.native import pure_python_asked

UNLINK = 1
LINK = 2
#: `table[m] == SKIP`: slots with mark m do not move
SKIP = 255

Move = Callable[[Any, Any, Any, list[Any], bytes, Sequence[int]], list[int]]
Gather = Callable[[Any, list[int]], bytes]


def table(k: int, moves: dict[int, tuple[int, int]]) -> bytes:
    """The table of `move` for marks `0..k-1`: `moves[old] = (new, action)`, every
    other mark left alone."""
    out = bytearray([SKIP] * k + [0] * k)
    for old, (new, action) in moves.items():
        out[old] = new
        out[k + old] = action
    return bytes(out)


def move_py(
    marks: MutableSequence[int],
    prev: MutableSequence[int],
    nxt: MutableSequence[int],
    slots: list[Any],
    table: bytes,
    heads: Sequence[int],
) -> list[int]:
    k = len(table) // 2
    if len(table) % 2 or not k:
        raise ValueError("table must hold an even number of bytes")
    if len(heads) != k:
        raise ValueError("heads must have one entry per mark")
    counts = [0] * k
    limit = len(marks)
    for slot in slots:
        if slot is None:
            continue
        if not 0 <= slot < limit:
            raise IndexError(f"slot {slot} out of range 0..{limit - 1}")
        m = marks[slot]
        if m >= k:
            raise ValueError(f"slot {slot}: mark {m} not in the table")
        t = table[m]
        if t == SKIP:
            continue
        marks[slot] = t
        counts[m] += 1
        a = table[k + m]
        if a & UNLINK:
            p = prev[slot]
            n = nxt[slot]
            nxt[p] = n
            prev[n] = p
        if a & LINK:
            h = heads[t]
            last = prev[h]
            nxt[last] = slot
            prev[slot] = last
            nxt[slot] = h
            prev[h] = slot
    return counts


def gather_py(buffer: Sequence[int], slots: list[int]) -> bytes:
    """`bytes(buffer[s] for s in slots)` (the C `gather` is one loop, ~30x faster)."""
    return bytes(map(buffer.__getitem__, slots))


_native: Any
try:  # optional: built from setup.py where there is a C compiler
    from kvtiers.policies import _slotlinks as _native
except ImportError:  # pragma: no cover - depends on the install
    _native = None

#: whether the C helper was built
NATIVE = _native is not None
#: whether policies built from now on use it
USE_NATIVE = NATIVE and not pure_python_asked()


def native() -> Any:
    """The C helper module when built and `USE_NATIVE`, else None (read at each
    policy's construction: tests switch `USE_NATIVE`)."""
    return _native if USE_NATIVE else None


def move_function() -> Move:
    """The C `move` when built and `USE_NATIVE`, else `move_py`."""
    c = native()
    return move_py if c is None else c.move


def gather_function() -> Gather:
    """The C `gather` when built and `USE_NATIVE`, else `gather_py`."""
    c = native()
    return gather_py if c is None else c.gather
