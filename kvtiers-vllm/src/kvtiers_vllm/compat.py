"""Which vLLM kvtiers-vllm runs inside, and the error when it cannot.

kvtiers-vllm is written against vLLM's offloading interfaces of one minor release
(`SUPPORTED`); they change between minors (vllm#58087 added a constructor keyword to
every secondary tier). `require_vllm()` is called at import by every module that
subclasses a vLLM class, so a wrong install fails there, naming what is installed.
Pure: reads package metadata only, never imports vLLM.
"""

from __future__ import annotations

import importlib.metadata as md

SUPPORTED = "0.33"  # the vLLM minor release these interfaces match
SUPPORTED_TEXT = f"supported: vLLM {SUPPORTED}.x"


class UnsupportedVllmError(ImportError):
    """vLLM is missing, or its version is not `SUPPORTED`.x."""


def installed_vllm() -> str | None:
    """The installed vLLM's version, or None when vLLM is not installed."""
    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


def is_supported(version: str) -> bool:
    """Whether `version` (a vLLM version string, e.g. "0.33.0", "0.33.1rc1",
    "0.33.0+cu129") is of the supported minor release."""
    parts = version.split("+", 1)[0].split(".")
    return ".".join(parts[:2]) == SUPPORTED and len(parts) >= 2


def require_vllm(version: str | None = None) -> str:
    """The installed vLLM's version; raises `UnsupportedVllmError` when vLLM is missing
    or not `SUPPORTED`.x. `version` overrides what is installed (for tests)."""
    found = installed_vllm() if version is None else version
    if found is None:
        raise UnsupportedVllmError(
            f"kvtiers-vllm needs vLLM, which is not installed ({SUPPORTED_TEXT}; "
            f"install it with `pip install vllm=={SUPPORTED}.*`)"
        )
    if not is_supported(found):
        raise UnsupportedVllmError(
            f"kvtiers-vllm does not support the installed vLLM {found} ({SUPPORTED_TEXT})"
        )
    return found
