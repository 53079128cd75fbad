"""The one rule for the optional C helpers (`kvtiers.manager._slotops`,
`kvtiers.policies._slotlinks`): used when built, unless `KVTIERS_PURE_PYTHON` is set
to anything but "" or "0" when the module that loads them is first imported (tests
and benches compare the two paths that way)."""

from __future__ import annotations

import os

__all__ = ["pure_python_asked"]


def pure_python_asked() -> bool:
    """Whether the environment asks for the Python paths instead of the C helpers."""
    return os.environ.get("KVTIERS_PURE_PYTHON", "") not in ("", "0")
