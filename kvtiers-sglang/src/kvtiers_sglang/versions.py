"""Which SGLang releases kvtiers-sglang runs inside, and the error for any other.

kvtiers-sglang is written against SGLang's HiCache storage interface
(`sglang.srt.mem_cache.hicache_storage`) as of 0.5.23: the `dynamic` backend built
as `cls(storage_config, kwargs)`, the v1 zero-copy calls with `host_indices`, and
the host pool's `kv_buffer` layouts. `require_sglang()` is called at import by the
module that subclasses SGLang's class, so a wrong install fails there, naming what
is installed and what is supported. Pure: reads package metadata only.
"""

from __future__ import annotations

import importlib.metadata as md

#: The oldest SGLang release whose storage interface kvtiers-sglang matches, and the
#: minor releases it runs on (a new minor is added once the suite passed on it).
OLDEST: tuple[int, int, int] = (0, 5, 23)
SUPPORTED_MINORS: tuple[str, ...] = ("0.5",)
SUPPORTED_TEXT = "supported: SGLang 0.5.x from 0.5.23"


class UnsupportedSglangError(ImportError):
    """SGLang is missing, or its release is not a supported one."""


def installed_sglang() -> str | None:
    """The installed SGLang's version, or None when SGLang is not installed."""
    try:
        return md.version("sglang")
    except md.PackageNotFoundError:
        return None


def release_of(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version string ("0.5.23", "0.5.24rc1",
    "0.5.23+cu129"); None when it does not start with three numbers."""
    parts = version.split("+", 1)[0].split(".")
    if len(parts) < 3:
        return None
    numbers = []
    for part in parts[:3]:
        digits = ""
        for c in part:
            if not c.isdigit():
                break
            digits += c
        if not digits:
            return None
        numbers.append(int(digits))
    return numbers[0], numbers[1], numbers[2]


def is_supported(version: str) -> bool:
    """Whether `version` (an SGLang version string) is a supported release."""
    release = release_of(version)
    return (
        release is not None
        and f"{release[0]}.{release[1]}" in SUPPORTED_MINORS
        and release >= OLDEST
    )


def require_sglang(version: str | None = None) -> str:
    """The installed SGLang's version; raises `UnsupportedSglangError` when SGLang is
    missing or not supported. `version` overrides what is installed (for tests)."""
    found = installed_sglang() if version is None else version
    if found is None:
        raise UnsupportedSglangError(
            f"kvtiers-sglang needs SGLang, which is not installed ({SUPPORTED_TEXT}; "
            "install it with `pip install sglang==0.5.23`)"
        )
    if not is_supported(found):
        raise UnsupportedSglangError(
            f"kvtiers-sglang does not support the installed SGLang {found} ({SUPPORTED_TEXT})"
        )
    return found
