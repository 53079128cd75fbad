"""Eviction policies. Each one is a small class behind `EvictionPolicy`, registered
by name through the plugin registry (the core's built-ins are registered in
`kvtiers.plugins.builtins`)."""

from kvtiers.policies.base import EvictionPolicy
from kvtiers.policies.lru import LRUPolicy

__all__ = ["EvictionPolicy", "LRUPolicy"]
