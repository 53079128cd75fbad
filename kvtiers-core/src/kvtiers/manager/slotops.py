"""The CPU pool's per-block loops over hold counts and slot states, two ways: in
Python here, and in C in the optional `kvtiers.manager._slotops` (built by setup.py
where there is a C compiler). Both do exactly the same; `functions()` picks.

- `hold(holds, keys, slots)`: `holds[slot] += 1` per slot; returns the keys whose
  count went from 0 to 1, in order.
- `release(holds, keys, slots)`: `holds[slot] -= 1` per slot that is not None;
  returns the keys whose count reached 0, in order; a count already at 0 raises
  `AssertionError` (those before it are changed).
- `fill(buffer, slots, value)`: `buffer[slot] = value` per slot.

`holds` is an `array('i')` (or a writable buffer of 4-byte ints); `keys` and `slots`
lists of one length. Scheduler thread only. Set `KVTIERS_PURE_PYTHON=1` (or
`USE_NATIVE = False` before a pool is built) to use the Python loops.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, MutableSequence, Sequence
from typing import Any

from kvtiers.native import pure_python_asked

Hold = Callable[[Any, list[Any], list[Any]], list[Any]]
Fill = Callable[[Any, list[int], int], None]


def hold_py(
    holds: MutableSequence[int], keys: Sequence[Hashable], slots: Sequence[int]
) -> list[Any]:
    if len(keys) != len(slots):
        raise ValueError("keys and slots differ in length")
    fresh = []
    for key, slot in zip(keys, slots, strict=True):
        n = holds[slot]
        holds[slot] = n + 1
        if not n:
            fresh.append(key)
    return fresh


def release_py(
    holds: MutableSequence[int], keys: Sequence[Hashable], slots: Sequence[int | None]
) -> list[Any]:
    if len(keys) != len(slots):
        raise ValueError("keys and slots differ in length")
    last = []
    for key, slot in zip(keys, slots, strict=True):
        if slot is None:
            continue
        n = holds[slot] - 1
        if n < 0:
            raise AssertionError(f"slot {slot}: hold count below zero")
        holds[slot] = n
        if not n:
            last.append(key)
    return last


def fill_py(buffer: MutableSequence[int], slots: Sequence[int], value: int) -> None:
    for slot in slots:
        buffer[slot] = value


_slotops: Any
try:  # optional: built from setup.py where there is a C compiler
    from kvtiers.manager import _slotops
except ImportError:  # pragma: no cover - depends on the install
    _slotops = None

#: whether the C helper was built
NATIVE = _slotops is not None
#: whether pools built from now on use it
USE_NATIVE = NATIVE and not pure_python_asked()


def functions() -> tuple[Hold, Hold, Fill]:
    """`(hold, release, fill)`: the C helper's when built and `USE_NATIVE`, else
    the Python loops."""
    if USE_NATIVE and _slotops is not None:
        return _slotops.hold, _slotops.release, _slotops.fill
    return hold_py, release_py, fill_py
