"""Numbers for people: byte counts in binary units."""

from __future__ import annotations

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
