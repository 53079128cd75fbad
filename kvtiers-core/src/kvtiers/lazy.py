"""Faces that import their heavier names on first use (PEP 562's module
`__getattr__`), so that importing a face costs only what it imports eagerly."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(face: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of the module `face`: a name of `where` (name -> the module
    that defines it) is imported when first used and kept in the face's namespace;
    any other name is an AttributeError, as for a plain module."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[face], name, value)
        return value

    return __getattr__
