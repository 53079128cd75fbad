"""Words and numbers for people: byte counts in binary units, the name a typo
was probably meant to be."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: int) -> str:
    """`2 GiB`, `1.5 TiB`, `512 bytes`: exact units print without decimals."""
    unit = 0
    while abs(n) >= 1024 ** (unit + 1) and unit < len(_UNITS) - 1:
        unit += 1
    if unit == 0:
        return f"{n} bytes"
    whole, rest = divmod(abs(n), 1024**unit)
    sign = "-" if n < 0 else ""
    if rest == 0:
        return f"{sign}{whole} {_UNITS[unit]}"
    # Integer arithmetic: any int prints (a float overflows past 10^308).
    tenths = (abs(n) * 10 + 1024**unit // 2) // 1024**unit
    return f"{sign}{tenths // 10}.{tenths % 10} {_UNITS[unit]}"


def closest_name(word: str, choices: Iterable[str]) -> str | None:
    """The choice `word` most likely meant, or None: a name that differs only in
    case ("LRU" for "lru") first, else the closest by spelling."""
    names = list(choices)
    folded = {name.casefold(): name for name in names}
    if word.casefold() in folded:
        return folded[word.casefold()]
    close = difflib.get_close_matches(word, names, n=1)
    if not close:
        close = difflib.get_close_matches(word.casefold(), list(folded), n=1)
        close = [folded[close[0]]] if close else []
    return close[0] if close else None
