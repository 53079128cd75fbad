"""Which vLLM releases kvtiers-vllm runs inside, and the error for any other.

kvtiers-vllm is written against vLLM's offloading interfaces of a few minor releases
(`SUPPORTED`); they change between minors (vllm#58087 added a constructor keyword to
every secondary tier; 0.34 changed the worker's arguments and removed `touch`). What
differs between the supported minors lives in the other modules of this package, one
concern each. `require_vllm()` is called at import by every module that subclasses a
vLLM class, so a wrong install fails there, naming what is installed and what is
supported. Pure: reads package metadata only, never imports vLLM.
"""

from __future__ import annotations

import importlib.metadata as md

#: The vLLM minor releases whose interfaces kvtiers-vllm matches (oldest first).
#: A new minor is added here only once the suite passed on it.
SUPPORTED: tuple[str, ...] = ("0.33", "0.34")
SUPPORTED_TEXT = "supported: vLLM " + ", ".join(f"{m}.x" for m in SUPPORTED)


class UnsupportedVllmError(ImportError):
    """vLLM is missing, or its minor release is not one of `SUPPORTED`."""


def installed_vllm() -> str | None:
    """The installed vLLM's version, or None when vLLM is not installed."""
    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


def minor_of(version: str) -> str | None:
    """The minor release ("0.34") of a vLLM version string ("0.34.0", "0.34.1rc1",
    "0.34.0+cu129"); None when it has no minor part."""
    parts = version.split("+", 1)[0].split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    digits = "".join(c for c in parts[1] if c.isdigit())
    if not digits or not parts[1].startswith(digits):
        return None
    return f"{parts[0]}.{digits}"


def is_supported(version: str) -> bool:
    """Whether `version` (a vLLM version string) is of a supported minor release."""
    return minor_of(version) in SUPPORTED


def require_vllm(version: str | None = None) -> str:
    """The installed vLLM's version; raises `UnsupportedVllmError` when vLLM is missing
    or not of a `SUPPORTED` minor. `version` overrides what is installed (for tests)."""
    found = installed_vllm() if version is None else version
    if found is None:
        raise UnsupportedVllmError(
            f"kvtiers-vllm needs vLLM, which is not installed ({SUPPORTED_TEXT}; "
            f"install it with `pip install vllm=={SUPPORTED[-1]}.*`)"
        )
    if not is_supported(found):
        raise UnsupportedVllmError(
            f"kvtiers-vllm does not support the installed vLLM {found} ({SUPPORTED_TEXT})"
        )
    return found
