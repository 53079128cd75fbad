"""Numbers for people: byte counts in binary units."""

from __future__ import annotations

_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: int) -> str:
    """`2 GiB`, `1.5 TiB`, `512 bytes`: exact units print without decimals."""
    value = float(n)
    unit = 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{n} bytes"
    if value.is_integer():
        return f"{int(value)} {_UNITS[unit]}"
    return f"{value:.1f} {_UNITS[unit]}"
