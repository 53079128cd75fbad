"""The core registers its policies through the plugin hooks."""

from __future__ import annotations

from typing import Any

from kvtiers.plugins import load_registry
from kvtiers.policies import ARCPolicy, LRUPolicy, SievePolicy


def test_registry_lists_the_builtin_policies() -> None:
    policies = load_registry(entry_points=[]).policies
    expected: dict[str, Any] = {"lru": LRUPolicy, "arc": ARCPolicy, "sieve": SievePolicy}
    assert expected.keys() <= policies.keys()
    for name, cls in expected.items():
        loaded = policies[name].record.load()
        assert loaded is cls
        assert loaded.name == name
        assert len(loaded(capacity=8)) == 0
