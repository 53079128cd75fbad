"""Numbers no config means: integers beyond 64 bits and floats that are not finite.

JSON itself sets no bound, so `10^400` parses (as a Python int) and so does `1e400`
(as `inf`); a mapping may even hold `nan`. Such a value would pass the schema's
`minimum` and then break whatever does arithmetic with it (`float()` overflows,
`inf` seconds never time out, `json.dumps` writes `Infinity`, which is not JSON).
They are refused up front, each at its JSON path, before anything else looks at
the document.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvtiers.config.paths import join
from kvtiers.errors import ConfigProblem

# The largest integer any option takes (hash_seed is a 64-bit unsigned seed).
MAX_INTEGER = 2**64 - 1
#: Python converts at most 4300 digits (and says to change an interpreter setting);
#: longer integers are parsed as `LongInteger`
MAX_DIGITS = 4300


class LongInteger(int):
    """What JSON's integer of more than `MAX_DIGITS` digits parses to: a stand-in
    too large for any option (10**100, sign kept: printable, unlike the number
    written) that remembers how many digits were written, so the refusal names
    the option by its path and says how long the number was."""

    digits: int

    def __new__(cls, text: str) -> LongInteger:
        sign = -1 if text.startswith("-") else 1
        self = super().__new__(cls, sign * 10**100)
        self.digits = len(text.lstrip("-"))
        return self

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"

    __str__ = __repr__


def parse_integer(text: str) -> int:
    """JSON's integer: an int, or a `LongInteger` past Python's conversion limit."""
    return int(text) if len(text) <= MAX_DIGITS else LongInteger(text)


def number_problems(value: Any, path: str) -> list[ConfigProblem]:
    """Every integer beyond +-MAX_INTEGER and every non-finite float in `value`,
    walked iteratively (a deep document cannot exhaust the stack here)."""
    problems: list[ConfigProblem] = []
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            if abs(item) > MAX_INTEGER:
                problems.append(ConfigProblem(where, _too_large(item)))
        elif isinstance(item, float):
            if not math.isfinite(item):
                problems.append(ConfigProblem(where, _not_finite(item)))
        elif isinstance(item, Mapping):
            stack.extend((v, join(where, str(k))) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, join(where, i)) for i, v in enumerate(item))
    return problems


def _too_large(n: int) -> str:
    # str() of an int past 4300 digits raises (CPython's guard); 13000 bits is below it.
    digits: int | str
    if isinstance(n, LongInteger):
        digits = n.digits
    else:
        digits = len(str(abs(n))) if n.bit_length() < 13000 else "thousands of"
    return (
        f"an integer of {digits} digits is too large: options take integers up to "
        f"2**64 - 1 ({MAX_INTEGER})"
    )


def _not_finite(x: float) -> str:
    if math.isnan(x):
        return "expected a number, found NaN (not a JSON value)"
    return (
        "expected a finite number, found one too large to represent (such as 1e400, "
        "which reads as infinity)"
    )


def covered(path: str, bad: set[str]) -> bool:
    """True when `path` is one of `bad` or inside one (problems about a value that
    was already refused as a number say nothing new)."""
    return any(path == b or path.startswith(b + ".") or path.startswith(b + "[") for b in bad)
