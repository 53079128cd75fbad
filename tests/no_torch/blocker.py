"""Installed as `sitecustomize` in a child interpreter: torch (and Triton, which
needs it) cannot be imported there, as if they were not installed. Kept free of
kvtiers imports: it runs before anything else in the child."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

BLOCKED = ("torch", "triton")


class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


sys.meta_path.insert(0, NoTorch())
