"""Put first on a child interpreter's path: the top-level packages named in
KVTIERS_TEST_BLOCKED (comma-separated; default prometheus_client) cannot be
imported there, as if their extra were not installed."""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

BLOCKED = frozenset(os.environ.get("KVTIERS_TEST_BLOCKED", "prometheus_client").split(","))


class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


sys.meta_path.insert(0, Blocked())
